"""What every play of a cluster is given besides the lock: where packages, artifacts and
images come from (the cluster's settings), and the secrets a play reads from the controller.

Settings shape what a node carries, so they live with the cluster: resolved once at `up`
(the environment at that moment, else the settings file in the user config dir, which
the local set-up writes), stored in the cluster's spec, and reused by every later command
whoever runs it and from whatever shell. A later command run with a different value in its
environment is refused with the way to change it (`gpuprov settings NAME --set KEY=VALUE`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from pathlib import Path
from typing import Any

from gpuprov import catalog, defaults, validate
from gpuprov.errors import BadInput
from gpuprov.lock import os_lines, stack
from gpuprov.lock.lock_data import LockData
from gpuprov.paths import config_path
from gpuprov.sharing import choice as sharing_choice
from gpuprov.sharing import layouts as sharing_layouts
from gpuprov.state import ClusterRecord

# key: (environment variable, what it is)
SETTINGS: dict[str, tuple[str, str]] = {
    "apt_proxy": ("GPUPROV_APT_PROXY", "package cache the nodes' apt goes through (local nodes)"),
    "artifact_mirror": ("GPUPROV_ARTIFACT_MIRROR", "artifact mirror (cuDNN archive, installers)"),
    "registry_mirror": ("GPUPROV_REGISTRY_MIRROR", "container registry mirror for image pulls"),
    "registry_digests": ("GPUPROV_REGISTRY_DIGESTS",
                         "JSON: digests the registry mirror serves under the lock's image names"),
    "container_toolkit_repo": ("GPUPROV_CONTAINER_TOOLKIT_REPO",
                               "NVIDIA container toolkit apt repository"),
    "container_toolkit_repo_fpr": ("GPUPROV_CONTAINER_TOOLKIT_REPO_FPR",
                                   "that repository's signing key fingerprint"),
    "pull_bucket": ("GPUPROV_PULL_BUCKET",
                    "existing S3 bucket pull mode on AWS uses (prefix gpuprov/CLUSTER/) instead of making one"),
    "root_free_gib": ("GPUPROV_ROOT_FREE_GIB",
                      "free space (GiB) the preflight asks of every node's root file system "
                      f"(unset: {defaults.NODE_FREE_GIB}, local nodes {defaults.LOCAL_NODE_FREE_GIB})"),
}


def check(key: str, value: Any, where: str) -> str:
    """One setting's value, validated: each reaches apt sources, daemon.json or a play."""
    if key not in SETTINGS:
        raise BadInput(f"{where}: unknown setting '{key}' (known: {', '.join(SETTINGS)})")
    if not isinstance(value, str):
        raise BadInput(f"{where}: setting {key} must be a string, not {value!r}")
    if value == "":
        return value
    if key == "container_toolkit_repo_fpr":
        return validate.key_fingerprint(value, f"{where}: {key}")
    if key == "registry_digests":
        try:
            data = json.loads(value)
        except ValueError:
            raise BadInput(f"{where}: {key} must be a JSON object of image -> digest") from None
        if not isinstance(data, dict):
            raise BadInput(f"{where}: {key} must map image names to sha256: digests")
        for image, digest in data.items():
            validate.image_name(image, f"{where}: {key}")
            validate.digest(digest, f"{where}: {key} {image}")
        return json.dumps(data, sort_keys=True)
    if key == "pull_bucket":
        return validate.s3_bucket_name(value, f"{where}: {key}")
    if key == "root_free_gib":
        return str(validate.count(value, f"{where}: {key}"))
    return validate.mirror_url(value, f"{where}: {key}")


def _file() -> tuple[dict[str, str], Path]:
    path = config_path()
    if not path.is_file():
        return {}, path
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise BadInput(f"settings file {path} is not valid TOML ({exc})") from None
    # `state` says where this machine's records are (gpuprov.state_choice) and `identity` which key
    # its operator logs in with (gpuprov.identity): this machine's, not a cluster's settings.
    return {k: check(k, v, f"settings file {path}") for k, v in raw.items() if k not in ("state", "identity")}, path


def _environment() -> dict[str, str]:
    return {key: check(key, os.environ[env], env) for key, (env, _) in SETTINGS.items()
            if os.environ.get(env)}


def for_new_cluster() -> dict[str, dict[str, str]]:
    """The settings a new cluster records: {key: {"value", "from"}} for every key that has one
    (the environment wins over the settings file)."""
    found, path = _file()
    out = {k: {"value": v, "from": str(path)} for k, v in found.items() if v}
    out.update({k: {"value": v, "from": f"environment ({SETTINGS[k][0]})"}
                for k, v in _environment().items() if v})
    return dict(sorted(out.items()))


def recorded(cluster: ClusterRecord) -> dict[str, dict[str, str]] | None:
    options = cluster.spec.get("options") or {}
    return options.get("settings")


def values(cluster: ClusterRecord) -> dict[str, str]:
    """The cluster's settings ({key: value}); refuses an environment that says otherwise."""
    stored = recorded(cluster)
    if stored is None:
        # A cluster from before settings were recorded: what the sources say now (recorded by
        # its next `up`, or by `gpuprov settings NAME --record`).
        stored = for_new_cluster()
    have = {k: v["value"] for k, v in stored.items()}
    for key, value in _environment().items():
        if value != have.get(key, ""):
            env = SETTINGS[key][0]
            raise BadInput(
                f"{env}={value or '(empty)'} differs from cluster '{cluster.name}''s {key} "
                f"{have.get(key) or '(none)'} (recorded at up); unset {env}, or change the cluster "
                f"with `gpuprov settings {cluster.name} --set {key}=VALUE`"
            )
    return have


# Every field a lock of today's gpuprov has (an older one lacks those added since).
LOCK_FIELDS = frozenset(f.name for f in dataclasses.fields(stack.Lock))


def complete_lock(lock: LockData) -> LockData:
    """A stored lock with every field today's plays read: a lock stored by an older gpuprov
    lacks the fields added since (container toolkit, base images, ...); they are taken from
    the same request resolved against today's stack data, and what the lock has always wins
    (the plays map it to the roles' variables: roles/gpuprov_lock/vars/main.yml). A lock that has every
    field is used as it is (not resolved again: one resolution per command). A lock stored
    before locks had an OS is Debian 12's (its hash leaves ``os`` out when it is debian12); one stored
    before GPU sharing asks none (``gpu_sharing`` empty or absent: the plays read it with a default)."""
    if LOCK_FIELDS <= lock.keys() | {"os", "gpu_sharing"}:
        return {"os": os_lines.DEFAULT_OS, **lock}
    try:
        fresh = stack.resolve_types(stack.kinds_of(lock), cuda=lock.get("cuda", stack.DEFAULT_CUDA), os=lock.get("os"),
                                    driver=lock.get("driver_branch"), source=lock.get("source", stack.DEFAULT_SOURCE))
        current = fresh.as_dict()
    except BadInput:
        # A request today's data refuses (a branch no longer pinned): the fields' empty defaults.
        current = stack.from_dict({**lock, "packages": lock.get("packages", {})}).as_dict()
    return {**current, **lock}


def playbook_vars(cluster: ClusterRecord, lock: LockData) -> dict[str, Any]:
    """The extra variables every play of a cluster gets: the lock and where packages come from."""
    options = cluster.spec.get("options") or {}
    have = values(cluster)
    return {
        "gpuprov_stack": complete_lock(lock),
        "gpuprov_artifact_mirror": have.get("artifact_mirror", ""),
        "gpuprov_registry_mirror": have.get("registry_mirror", ""),
        "gpuprov_registry_digests": json.loads(have.get("registry_digests") or "{}"),
        "gpuprov_container_toolkit_repo_url": have.get("container_toolkit_repo", ""),
        "gpuprov_container_toolkit_repo_key_fingerprint": have.get("container_toolkit_repo_fpr", ""),
        "gpuprov_mirror_url": options.get("mirror_url", ""),
        "gpuprov_mirror_key_fingerprint": options.get("mirror_key_fingerprint", ""),
        # A MIG sharing's layout, from gpuprov's data files (the gpu_sharing and slurm roles).
        "gpuprov_gpu_sharing": sharing_layouts.role_inputs(
            sharing_choice.of_lock(lock.get("gpu_sharing")), catalog.find(lock.get("instance_type") or ""),
            lock.get("gpu")),
        # Operators' own keys (`gpuprov access`): granted present, revoked absent on the nodes.
        "gpuprov_access_keys": access_keys(cluster),
        # The cluster's own floor, for every node (over a host's root_free_gib and the local
        # nodes' need): only when the cluster recorded one; the role's 40 GiB otherwise.
        **({"gpu_preflight_root_free_gib": int(have["root_free_gib"])} if have.get("root_free_gib") else {}),
    }


def access_keys(cluster: ClusterRecord) -> list[dict[str, str]]:
    """The keys `gpuprov access grant` recorded (gpuprov.core.access checked each one whole), as
    the gpuprov_base role's access entry point takes them: {name, key, state}; a key an operator
    replaced, or a grant revoked, is absent."""
    out = []
    for who, entry in sorted((cluster.spec.get("access") or {}).items()):
        out += [{"name": who, "key": old, "state": "absent"} for old in entry.get("replaced", [])]
        out.append({"name": who, "key": entry["key"], "state": "absent" if entry.get("revoked_at") else "present"})
    return out


# Secrets a play reads from the controller: (environment variable, play variable that names
# a file). They reach the play through a file on a memory file system for the length of the
# run (gpuprov.ansible.runner.SecretFiles), never through its environment, its variables or
# its artifacts.
PLAY_SECRETS = (("GPUPROV_REGISTRY_PASSWORD", "base_images_registry_password_file"),)


def play_secrets() -> dict[str, str]:
    return {var: os.environ[env] for env, var in PLAY_SECRETS if os.environ.get(env)}


def write_file(path: Path | None = None) -> Path:
    """Write the settings the environment gives now into the settings file (what the local
    set-up does once, `make settings`, so that a plain shell finds the machine's package
    cache, mirror and registry)."""
    path = path or config_path()
    found = _environment()
    lines = ["# gpuprov settings: the defaults a new cluster records at `gpuprov up`",
             "# (the environment wins; `gpuprov settings NAME` shows what a cluster recorded).",
             "# Written by the local set-up (make settings)."]
    for key, value in sorted(found.items()):
        lines.append(f"# {SETTINGS[key][1]}")
        lines.append(f"{key} = {json.dumps(value)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
    return path
