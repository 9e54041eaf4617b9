"""Pull mode: nodes that bootstrap themselves (`gpuprov up --bootstrap pull`).

Push (the default for small clusters and for `provision` and `patch`, which pull with `--via
pull`) runs Ansible on this machine over SSH to every node. Pull inverts it, as ansible-pull does: gpuprov builds a
**bootstrap bundle** (bundle.py: the playbooks and roles, the cluster's resolved version lock
and play variables, the probes, and the very ansible-core and Python packages this controller
runs them with), content-addressed by its sha256; serves it to the cluster's nodes alone
(server.py: an HTTP server bound to the address the nodes reach, for the length of the
bootstrap, each node with a token of its own); and each node, at boot, fetches it, refuses any
bundle whose sha256 is not the one its boot configuration carries, runs the same site.yml over
a local connection, runs the same probes locally, and reports every task and the probe results
back (node/agent.py, node/gpuprov_pull.py). The controller shows the reports as the same
per-node progress as push and records the bootstrap and the verification the same way
(controller.py).

Nothing here is a second code path for the roles: the same playbooks, roles, variables and
probes run, only where Ansible runs differs.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODES = ("auto", "push", "pull")
# `--bootstrap auto` pulls above this many nodes (and where the provider serves pull). Up to
# it, push: gpuprov runs one fork per node up to 50 (gpuprov/ansible/inventory.py), so up to
# 50 nodes a push run has every node in flight at once and its controller does the work; past
# 50 it goes in waves and its time grows with the node count, while a pull run's does not
# (each node is its own controller). The threshold stays below the fork ceiling so that a
# cluster close to it is not pushed at a controller already at its limit.
PULL_ABOVE = 32
UNIT = "gpuprov-pull.service"
# The bootstrap's time out on a node (the agent's deadline_s): the bundle fetched within FETCH_S,
# then the plays and the probes within RUN_S (a driver's DKMS build and CUDA from a slow mirror
# fit; the agent stops them past it and says so). The final report has REPORT_GRACE_S of its own
# after the run, however long the run took; a node's presigned URLs live for all of it, and
# URL_SLACK_S more (the hand-over, clocks).
FETCH_S = 900
RUN_S = 3 * 3600
DEADLINE_S = FETCH_S + RUN_S
REPORT_GRACE_S = 300
URL_SLACK_S = 600
# Through an object store, a node writes a report batch at most this often (each one an object:
# a PUT request, and one more key for the controller's listing).
OBJECT_REPORT_S = 5


@dataclass(frozen=True)
class Boot:
    """What a launch gives each node so that it pulls its bootstrap at boot (Plan.pull)."""

    bundle_url: str
    report_url: str
    sha256: str
    key: bytes  # the session key the node tokens are derived from; kept in memory only
    profile: str = ""  # the bundle's node profile for the nodes a launch boots (one type)
    deadline_s: int = DEADLINE_S
    # Through an object store (the provider's pull_channel, e.g. aws/s3.py's Channel): each
    # node's presigned GET of the bundle and POST policy for its report prefix replace the URLs.
    channel: Any = None

    def url_lifetime_s(self) -> int:
        """How long a node's presigned URLs must live: its run's budget, its final report's grace."""
        return self.deadline_s + REPORT_GRACE_S + URL_SLACK_S

    def token(self, node: str) -> str:
        return node_token(self.key, node)

    def node_config(self, node: str, profile: str) -> dict[str, object]:
        """The node's boot configuration (/etc/gpuprov/pull.json, 0600 root): with its token
        (who it is), the secret it signs its reports with (report_secret)."""
        config = {"bundle_url": self.bundle_url, "report_url": self.report_url, "sha256": self.sha256,
                  "node": node, "token": self.token(node), "report_secret": report_secret(self.key, node),
                  "profile": profile, "deadline_s": self.deadline_s, "report_grace_s": REPORT_GRACE_S}
        if self.channel is not None:  # no bearer token: the presigned URLs are the node's only access
            config = {k: v for k, v in config.items() if k != "token"}
            # Valid for the agent's whole time budget, and its last reports after it.
            config |= {**self.channel.node_urls(node, self.sha256, self.url_lifetime_s()),
                       "report_every_s": OBJECT_REPORT_S}
        return config


    def archive(self, node: str, profile: str | None = None) -> bytes:
        """A tar to unpack at a node's root before its first boot: the agent, its systemd unit
        (enabled) and the node's boot configuration."""
        import tarfile

        here = Path(__file__).resolve().parent / "node"
        config = (json.dumps(self.node_config(node, self.profile if profile is None else profile),
                             indent=1) + "\n").encode()
        entries = [
            ("usr/local/lib/gpuprov/pull-agent.py", (here / "agent.py").read_bytes(), 0o755),
            (f"etc/systemd/system/{UNIT}", (here / UNIT).read_bytes(), 0o644),
            ("etc/gpuprov/pull.json", config, 0o600),
        ]
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for directory in ("etc/gpuprov", "usr/local/lib/gpuprov"):
                info = tarfile.TarInfo(directory)
                info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o700, int(time.time())
                tar.addfile(info)
            for path, data, mode in entries:
                info = tarfile.TarInfo(path)
                info.size, info.mode, info.mtime = len(data), mode, int(time.time())
                tar.addfile(info, io.BytesIO(data))
            link = tarfile.TarInfo(f"etc/systemd/system/multi-user.target.wants/{UNIT}")
            link.type, link.linkname = tarfile.SYMTYPE, f"/etc/systemd/system/{UNIT}"
            tar.addfile(link)
        return buf.getvalue()


def node_token(key: bytes, node: str) -> str:
    """A node's token: HMAC-SHA256 of its name under the session key (one per node; a node
    cannot report as another)."""
    return hmac.new(key, node.encode(), hashlib.sha256).hexdigest()


def report_secret(key: bytes, node: str) -> str:
    """The secret a node signs its report batches with: derived from the session key as its
    token is, under another label, so the one never gives the other (a captured bearer token
    alone cannot sign a report)."""
    return hmac.new(key, b"gpuprov-pull-report\0" + node.encode(), hashlib.sha256).hexdigest()


def report_signature(secret: str, seq: int, body: bytes) -> str:
    """A report batch's signature (the X-Gpuprov-Signature header): HMAC-SHA256 under the
    node's report secret of its sequence number (X-Gpuprov-Seq), a newline, and its body.
    The agent (node/agent.py, standard library only) computes the same."""
    return hmac.new(secret.encode(), str(seq).encode() + b"\n" + body, hashlib.sha256).hexdigest()


def choose(requested: str, count: int, can_pull: bool) -> str:
    """The bootstrap mode of one `up`: what was asked, or (auto) pull above PULL_ABOVE nodes
    where the provider serves it, push otherwise."""
    if requested != "auto":
        return requested
    return "pull" if can_pull and count > PULL_ABOVE else "push"
