#!/usr/bin/python3
"""gpuprov pull agent: a node bootstraps itself at boot (`gpuprov up --bootstrap pull`).

Installed by the launch with its boot configuration (/etc/gpuprov/pull.json, root 0600: the
bundle's address and sha256, where to report, the node's name and token) and started once by
gpuprov-pull.service. Python's standard library only: it runs before anything is installed.

1. Fetch the bootstrap bundle from the controller, and refuse it (reported, nothing
   unpacked) unless its sha256 is the one the boot configuration carries.
2. Unpack it, check its format and this Python, and write a one-host inventory for this node
   (its profile's host variables, a local connection).
3. Run the bundle's site.yml (or a patch's patch.yml, in check mode for its plan: the bundle's
   manifest says which) with the bundle's ansible-core, its callback writing each task's start
   and outcome to the event file; after a run of every play that succeeded, write the node's
   manifest (write_manifest: the bundle's manifest program, as push runs it) and report its
   digest and item count with the outcome.
4. Run the bundle's probes on this machine (pytest + testinfra's local connection). The plays
   and the probes stop at the run's deadline (deadline_s: the bootstrap's budget), said so.
5. Remove the boot configuration (the token) and the unpacked bundle, then send every event and
   the outcome ("done": the token is gone), each batch numbered and resent until acknowledged,
   for report_grace_s after the run however long it took. A reboot does not run it again.

Through an object store (``"channel": "s3"``, `up --provider aws`): the bundle comes from a
presigned GET, and each batch is written as an object of its own under this node's prefix
through the presigned POST the configuration carries (put_object); the controller lists and
reads them. The store's answer is the acknowledgement.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

STATE = Path("/var/lib/gpuprov/pull")
MAX_BUNDLE = 1 << 30
# The bundle formats this agent reads: 1, a site run; 2, a patch's round (an older agent refuses it).
FORMATS = (1, 2)
MAX_BATCH = 500  # events in one report batch, and characters in one string: what the
MAX_TEXT = 4096  # controller takes (gpuprov/pull/reports.py)
HEARTBEAT_S = 60.0  # through an object store, an empty batch at most this often (the node lives)
REPORT_GRACE_S = 300  # the final report's own time, after the run, however long the run took


class Reporter:
    """Sends the event file's lines to the controller in numbered batches, from a thread, each
    signed (HMAC-SHA256 under the node's report secret over a sequence number that grows with
    every send, and the body: gpuprov.pull.report_signature): the token says who the node is, the
    signature that the report is its own. Strings are cut to what the controller takes (MAX_TEXT)."""

    def __init__(self, config: dict, events: Path) -> None:
        self.config, self.events, self.acked = config, events, 0
        # The last sequence number sent, kept beside the events: an agent started again (the
        # node rebooted mid-run) goes on above it, where the controller refuses what it has seen.
        self.seq_file = events.with_name(events.name + ".seq")
        try:
            self.seq = int(self.seq_file.read_text())
        except (OSError, ValueError):
            self.seq = 0
        self.refused, self.last_sent = "", 0.0  # refused: why the controller refused this node (it stops)
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def add(self, event: str, **data: object) -> None:
        data = {k: clip(v) if isinstance(v, str) else v for k, v in data.items()}
        rows = data.get("rows")
        if isinstance(rows, list):
            data["rows"] = [{**r, "detail": clip(str(r.get("detail", "")))} for r in rows]
        with self.events.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"event": event, "event_data": {"host": self.config["node"], **data}}) + "\n")

    def _loop(self) -> None:
        while not self.stop.wait(float(self.config.get("report_every_s", 2.0))):
            self.send()

    def send(self) -> bool:  # whole lines only: the plays' callback (another process) may be mid-line
        with self.lock:
            if self.refused:
                return True  # nothing more to say: the controller has failed this node
            lines = self.events.read_text(encoding="utf-8").split("\n")[:-1] if self.events.exists() else []
            if self.config.get("channel") == "s3" and self.acked >= len(lines) \
                    and time.monotonic() - self.last_sent < HEARTBEAT_S:
                return True  # an object store: an empty batch only now and then, to say it lives
            batch = [json.loads(line) for line in lines[self.acked:self.acked + MAX_BATCH]]
            body = json.dumps({"from": self.acked, "events": batch}).encode()
            self.seq += 1
            self.seq_file.write_text(str(self.seq))
            if self.config.get("channel") == "s3":
                try:
                    put_object(self.config, body, self.seq)
                except (OSError, ValueError):
                    return False
                self.last_sent = time.monotonic()
                self.acked += len(batch)
                return self.acked >= len(lines)
            try:
                answer = json.loads(post(self.config, self.config["report_url"], body, self.seq))
            except urllib.error.HTTPError as exc:
                if exc.code == 400:
                    try:
                        self.refused = exc.read(MAX_TEXT).decode(errors="replace") or "refused"
                    except OSError:
                        self.refused = "refused"
                    return True
                return False
            except (OSError, ValueError):
                return False
            self.acked = max(self.acked, int(answer.get("have", 0)))
            return self.acked >= len(lines)

    def finish(self, deadline: float) -> bool:
        self.stop.set()
        while time.monotonic() < deadline:
            if self.send():
                return True
            time.sleep(3)
        return False


def clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 3] + "..."


def signature(secret: str, seq: int, body: bytes) -> str:
    """HMAC-SHA256 of a report batch: its sequence number, a newline, its body."""
    return hmac.new(secret.encode(), str(seq).encode() + b"\n" + body, hashlib.sha256).hexdigest()


def put_object(config: dict, body: bytes, seq: int) -> None:
    """One batch as an object of its own under this node's prefix, through its presigned POST
    (the store checks the policy: this prefix only). Its name carries the sequence number and
    the batch's signature; writing it again writes the same object."""
    sig = signature(config["report_secret"], seq, body)
    fields = {**config["report_fields"], "key": f"{config['report_prefix']}{seq:08d}-{sig}.json"}
    boundary = "gpuprov-" + hashlib.sha256(body).hexdigest()[:32]
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
             for k, v in fields.items()]
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="batch.json"\r\n'
                 f'Content-Type: application/json\r\n\r\n'.encode() + body + f"\r\n--{boundary}--\r\n".encode())
    req = urllib.request.Request(config["report_url"], data=b"".join(parts), method="POST",
                                 headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    with urllib.request.urlopen(req, timeout=30) as answer:
        answer.read()


def request(config: dict, url: str, body: bytes | None = None) -> urllib.request.Request:
    if config.get("channel") == "s3":  # a presigned URL, and the headers it signed (the bucket's owner)
        return urllib.request.Request(url, method="GET", headers=dict(config.get("bundle_headers") or {}))
    headers = {"Authorization": f"Bearer {config['token']}", "X-Gpuprov-Node": config["node"]}
    if body is not None:
        headers["Content-Type"] = "application/json"
    return urllib.request.Request(url, data=body, headers=headers, method="POST" if body is not None else "GET")


def post(config: dict, url: str, body: bytes, seq: int) -> bytes:
    req = request(config, url, body)
    req.add_header("X-Gpuprov-Seq", str(seq))
    req.add_header("X-Gpuprov-Signature", signature(config["report_secret"], seq, body))
    with urllib.request.urlopen(req, timeout=20) as answer:
        return answer.read()


def fetch(config: dict, deadline: float) -> bytes:
    """The bundle; retried (the controller may still be starting) until the deadline."""
    wait = 2.0
    while True:
        try:
            with urllib.request.urlopen(request(config, config["bundle_url"]), timeout=60) as answer:
                data = answer.read(MAX_BUNDLE + 1)
            if len(data) > MAX_BUNDLE:
                raise ValueError("bundle larger than 1 GiB")
            return data
        except (OSError, urllib.error.URLError) as exc:
            if time.monotonic() + wait > deadline:
                raise RuntimeError(f"bundle not fetched from {config['bundle_url']}: {exc}") from None
            time.sleep(wait)
            wait = min(wait * 2, 30.0)


def unpack(data: bytes, root: Path) -> dict:
    """The bundle under ``root`` (regular files and directories only, nothing outside it);
    its manifest."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True, mode=0o700)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            # By name alone (no path resolution per entry: thousands of them): relative, no
            # "..", no empty part, and a regular file or a directory; anything else stops it.
            if not (member.isfile() or member.isdir()) or member.name.startswith("/") or ".." in parts \
                    or "" in parts or "." in parts:
                raise RuntimeError(f"bundle entry {member.name!r} refused")
            target = os.path.join(root, member.name)
            if member.isdir():
                os.makedirs(target, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None
            with open(target, "wb") as out:
                out.write(source.read())
            if member.mode & 0o777 != 0o644:
                os.chmod(target, member.mode & 0o755)
    manifest = json.loads((root / "manifest.json").read_text())
    if manifest.get("format") not in FORMATS:
        raise RuntimeError(f"bundle format {manifest.get('format')}, this agent reads {', '.join(map(str, FORMATS))}")
    if sys.version_info[:2] < tuple(manifest["python_min"]):
        need = ".".join(map(str, manifest["python_min"]))
        raise RuntimeError(f"the bundle's ansible-core {manifest['ansible_core']} needs Python >= {need}; "
                           f"this node has {sys.version.split()[0]}")
    return manifest


def inventory(root: Path, config: dict) -> Path:
    nodes = json.loads((root / "site" / "nodes.json").read_text())
    kind = config.get("profile") or ""
    if kind not in nodes["profiles"]:
        raise RuntimeError(f"the bundle has no host variables for node profile {kind!r}")
    host = {**nodes["profiles"][kind]["hostvars"], "ansible_connection": "local"}
    data = {"all": {"children": {nodes["group"]: {"hosts": {config["node"]: host}, "vars": nodes["group_vars"]}}}}
    path = root / "inventory.yml"
    path.write_text(json.dumps(data, indent=1))
    (root / "expectations.json").write_text(json.dumps({"local": nodes["profiles"][kind]["expect"]}))
    return path


def environment(root: Path, events: Path, config: dict, items: Path | None = None) -> dict[str, str]:
    """The plays' environment; ``items``: where the callback keeps the run's items (a run of
    every play: the manifest's), else none is kept."""
    return {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
        # Bytecode is written under the unpacked bundle (removed with it): compiled once a run.
        "PYTHONPATH": str(root / "lib"),
        "ANSIBLE_ROLES_PATH": str(root / "site" / "roles"), "ANSIBLE_COLLECTIONS_PATH": str(root / "collections"),
        "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "False", "ANSIBLE_CALLBACKS_ENABLED": "gpuprov_pull",
        "ANSIBLE_CALLBACK_PLUGINS": str(root / "plugins" / "callback"),
        "ANSIBLE_HOME": str(root / "ansible-home"), "ANSIBLE_LOCAL_TEMP": str(root / "ansible-tmp"),
        "ANSIBLE_RETRY_FILES_ENABLED": "False", "ANSIBLE_NOCOLOR": "1", "ANSIBLE_GATHERING": "smart",
        "ANSIBLE_INJECT_FACT_VARS": "False", "ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3",
        "GPUPROV_PULL_EVENTS": str(events), "GPUPROV_PULL_NODE": config["node"],
        **({"GPUPROV_PULL_ITEMS": str(items)} if items is not None else {}),
    }


MANIFEST_SCOPE = "site"  # a run of every play (gpuprov.manifest.record.SITE)


def write_manifest(root: Path, manifest: dict, items: Path, node_root: str | None = None) -> dict:
    """The node's manifest written by the bundle's manifest program (gpuprov/manifest/node.py,
    run as push runs it: ``python3 -I -S``, the request on stdin) from the items the callback
    kept: {"digest", "items"}, or {"error"} (the controller records none: the node's next
    `provision` runs it). ``node_root``: the program's --root (a test's tree)."""
    program = root / "lib" / "gpuprov" / "manifest" / "node.py"
    try:
        lines = [json.loads(line) for line in items.read_text(encoding="utf-8").splitlines() if line.strip()] \
            if items.exists() else []
        if any(i.get("kind") == "overflow" for i in lines):
            return {"error": next(i["name"] for i in lines if i.get("kind") == "overflow")}
        request = {"items": lines, "scope": MANIFEST_SCOPE, "gpuprov": manifest["gpuprov"],
                   "program": hashlib.sha256(program.read_bytes()).hexdigest()}
        cmd = [sys.executable, "-I", "-S", str(program), *(["--root", node_root] if node_root else []), "snapshot"]
        proc = subprocess.run(cmd, input=json.dumps(request), capture_output=True, text=True, timeout=300,
                              check=False)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            return {"error": clip(f"the manifest program failed: {tail}")}
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
        return {"digest": str(answer["digest"]), "items": int(answer["items"])}
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError, subprocess.TimeoutExpired) as exc:
        return {"error": clip(f"the manifest was not written: {type(exc).__name__}: {exc}")}


PLAYBOOKS = ("site.yml", "patch.yml")  # what a bundle may run: the site, or a patch's roll


def playbook(root: Path, manifest: dict) -> Path:
    """The bundle's playbook (site.yml unless a patch's): one of PLAYBOOKS, never a path."""
    name = manifest.get("playbook", "site.yml")
    if name not in PLAYBOOKS:
        raise RuntimeError(f"the bundle asks for playbook {str(name)[:80]!r}; this agent runs {', '.join(PLAYBOOKS)}")
    return root / "site" / "playbooks" / name


def plays(root: Path, manifest: dict) -> list[Path]:
    """The playbooks a site run with tags runs (the bundle's "plays": files of its site/playbooks
    that site.yml imports, by their names), or [] for the bundle's playbook itself."""
    names = manifest.get("plays")
    if not names or manifest.get("playbook", "site.yml") != "site.yml":
        return []
    book = root / "site" / "playbooks"
    imported = set(re.findall(r"(?m)^(?:- |  )ansible\.builtin\.import_playbook: ([a-z0-9_]+\.yml)\s*$",
                              (book / "site.yml").read_text()))
    if not isinstance(names, list) or not all(isinstance(n, str) and n in imported for n in names):
        raise RuntimeError(f"the bundle's plays {str(names)[:120]!r} are not playbooks its site.yml imports")
    return [book / name for name in names]


def within(cmd: list[str], until: float | None, what: str, **how: object) -> int:
    """``cmd``'s exit status; past ``until`` (the run's budget) it is stopped, its children with it."""
    proc = subprocess.Popen(cmd, start_new_session=True, **how)  # type: ignore[call-overload]
    try:
        return proc.wait(timeout=None if until is None else max(1.0, until - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        raise TimeoutError(f"{what} passed the run's time budget (deadline_s) and were stopped") from None


def converge(root: Path, manifest: dict, env: dict[str, str], log: Path, until: float | None = None) -> int:
    cmd = [sys.executable, "-c", "import sys; from ansible.cli.playbook import main; "
           "sys.argv[0] = 'ansible-playbook'; main()",
           # The play variables, every string tagged !unsafe by the controller: data, never a template.
           "-i", str(root / "inventory.yml"), "-e", f"@{root / 'site' / 'vars.yml'}",
           *map(str, plays(root, manifest) or [playbook(root, manifest)])]
    if manifest.get("tags"):
        cmd += ["--tags", ",".join(manifest["tags"])]
    if manifest.get("check") is True:  # a patch's plan: check mode, nothing changed
        cmd += ["--check"]
    with log.open("a") as out:
        return within(cmd, until, "the plays", env=env, stdout=out, stderr=subprocess.STDOUT, cwd=root)


def probes(root: Path, manifest: dict, env: dict[str, str], log: Path, until: float | None = None) -> list[dict]:
    results = root / "probes.jsonl"
    results.write_text("")
    probes_dir = root / "lib" / "gpuprov" / "probes"
    # The probes of the plays the bundle runs (its "probes": a marker expression the controller
    # made from the tags; none: every probe), at the quick level.
    only = manifest.get("probes")
    cmd = [sys.executable, "-m", "pytest", str(probes_dir), "-p", "gpuprov.probes.collect", "-p",
           "no:cacheprovider", "--hosts=local://", "-q", "-rN", "-m",
           f"({only}) and not full" if only else "not full"]
    env = {**env, "GPUPROV_EXPECTATIONS": str(root / "expectations.json"),
           "GPUPROV_PROBE_RESULTS": str(results)}
    with log.open("a") as out:
        within(cmd, until, "the probes", env=env, stdout=out, stderr=subprocess.STDOUT, cwd=root)
    return [json.loads(line) for line in results.read_text().splitlines() if line.strip()]


def main(config_path: str) -> int:
    config = json.loads(Path(config_path).read_text())
    deadline = time.monotonic() + int(config.get("deadline_s", 3600))
    STATE.mkdir(parents=True, exist_ok=True, mode=0o700)
    events, log = STATE / "events.jsonl", STATE / "pull.log"
    events.write_text("")
    reporter = Reporter(config, events)
    reporter.thread.start()
    reporter.add("agent", msg="started")
    root = STATE / config["sha256"]
    outcome: dict[str, object] = {"rc": 1}
    try:
        data = fetch(config, min(deadline, time.monotonic() + 900))
        got = hashlib.sha256(data).hexdigest()
        if got != config["sha256"]:
            reporter.add("refused", msg=f"bundle sha256 {got}, expected {config['sha256']}: not unpacked, "
                         "not run")
            outcome = {"rc": 3, "refused": True}
            return 3
        manifest = unpack(data, root)
        del data
        inventory(root, config)
        # A run of some plays (--tags), a patch's or one in check mode writes no manifest (as
        # push): a manifest covers the site, converged.
        whole = not manifest.get("tags") and manifest.get("playbook", "site.yml") == "site.yml" \
            and manifest.get("check") is not True
        items = root / "items.jsonl" if whole else None
        env = environment(root, events, config, items)
        began = time.monotonic()
        rc = converge(root, manifest, env, log, deadline)
        timing = {"converge_s": round(time.monotonic() - began, 1)}
        if rc != 0:
            outcome = {"rc": rc, **timing}
            return 1
        written = write_manifest(root, manifest, items) if items is not None else None
        began = time.monotonic()
        rows = probes(root, manifest, env, log, deadline)
        timing["probes_s"] = round(time.monotonic() - began, 1)
        if not rows:  # a verification that did not look is a failure, not an empty pass
            tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-1:]
            reporter.add("agent_failed", msg=f"the probes did not run: {' '.join(tail)} (node: {log})")
            outcome = {"rc": 4, **timing}
            return 1
        reporter.add("probes", rows=rows)
        outcome = {"rc": 0, **timing, **({"manifest": written} if written is not None else {})}
        return 0
    except Exception as exc:  # noqa: BLE001 (whatever it is, the controller is told why)
        reporter.add("agent_failed", msg=f"{type(exc).__name__}: {exc}")
        return 1
    finally:
        # The token and the unpacked bundle go before "done" is sent (the reporter holds the
        # token in memory): a controller that reads "done" knows they are gone from the node.
        for keep in ("manifest.json", "probes.jsonl"):
            if (root / keep).exists():
                shutil.copy2(root / keep, STATE / keep)
        shutil.rmtree(root, ignore_errors=True)
        Path(config_path).unlink(missing_ok=True)
        reporter.add("done", **outcome)
        reporter.finish(time.monotonic() + int(config.get("report_grace_s", REPORT_GRACE_S)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "/etc/gpuprov/pull.json"))
