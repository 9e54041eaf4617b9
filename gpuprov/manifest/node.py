"""The node's side of the manifest: one program, standard library only, run as root with
``python3 -I -S`` over the cluster's pinned SSH (gpuprov.manifest.remote ships it).

    snapshot   stdin: {"items": [...], "scope": S, "gpuprov": V, "program": SHA}; records the
               state of each item now (with the items of the manifest the same plays wrote
               before, and every held package), and the inputs the plays depended on, in
               /var/lib/gpuprov/manifest.json
               (root only: 0600); prints {"digest", "items"}.
    check      stdin: {"gpuprov": V, "program": SHA}; compares the node with its manifest and
               prints {"state": held|drifted|missing|unreadable|other-version, "digest", "items",
               "drift": [words, ...]}.

An item is {"kind": path|package|service|sysctl|module, "name": ...}; what each one's state
holds: ``read_*`` below. Sysctl keys and kernel modules are found by the program itself in the
managed files that set them (/etc/sysctl.d/*.conf, /etc/modules-load.d/*.conf). ``--root DIR``
reads and writes under DIR instead of / (the tests' temporary trees); package states are read
with dpkg-query (``--admindir`` under DIR), services with one ``systemctl show``.

This file is sent to the node as it is: it imports nothing of gpuprov and nothing outside
the standard library.
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys

FORMAT = 1
MANIFEST = "/var/lib/gpuprov/manifest.json"
SYSCTL_DIRS = ("/etc/sysctl.d/", "/usr/lib/sysctl.d/", "/run/sysctl.d/")
MODULE_DIRS = ("/etc/modules-load.d/", "/usr/lib/modules-load.d/")
ROOT = "/"


def at(path: str) -> str:
    """``path`` under the root this run reads (/ on a node)."""
    return path if ROOT == "/" else os.path.join(ROOT, path.lstrip("/"))


def run(argv: list[str]) -> str:
    """A command's stdout ('' when it cannot run: a node without it)."""
    if shutil.which(argv[0]) is None:
        return ""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout


# -- the state of each kind of item ---------------------------------------------------------------
def read_path(name: str) -> dict:
    """exists, type, mode, owner; a file's sha256, a link's target."""
    try:
        st = os.lstat(at(name))
    except FileNotFoundError:
        return {"exists": False}
    except OSError as exc:
        return {"exists": True, "error": exc.strerror or str(exc)}
    out = {"exists": True, "mode": format(stat.S_IMODE(st.st_mode), "04o"), "owner": owner(st)}
    if stat.S_ISLNK(st.st_mode):
        out |= {"type": "link", "target": os.readlink(at(name))}
    elif stat.S_ISDIR(st.st_mode):
        out["type"] = "dir"
    elif stat.S_ISREG(st.st_mode):
        digest = hashlib.sha256()
        try:
            with open(at(name), "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
        except OSError as exc:
            return out | {"type": "file", "error": exc.strerror or str(exc)}
        out |= {"type": "file", "sha256": digest.hexdigest()}
    else:
        out["type"] = "other"
    return out


def owner(st: os.stat_result) -> str:
    try:
        user = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        user = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return f"{user}:{group}"


def read_packages(names: list[str]) -> dict[str, dict]:
    """Each package's installed version (None: not installed) and whether it is held."""
    every = dpkg_states()
    return {n: every.get(n, {"version": None, "hold": False}) for n in names}


def dpkg_states() -> dict[str, dict]:
    """Every package dpkg knows: its version (None: not installed) and hold, in one dpkg-query."""
    argv = ["dpkg-query", "-W", "-f=${Package}\t${Version}\t${Status}\n"]
    if ROOT != "/":
        argv.insert(1, f"--admindir={at('/var/lib/dpkg')}")
    out = {}
    for line in run(argv).splitlines():
        parts = line.split("\t")
        if len(parts) == 3:
            want, _, state = [*parts[2].split(), "", "", ""][:3]
            out[parts[0]] = {"version": parts[1] if state == "installed" else None, "hold": want == "hold"}
    return out


def read_services(names: list[str]) -> dict[str, dict]:
    """Each unit's enablement and activity, in one ``systemctl show``."""
    out = {n: {"enabled": "unknown", "active": "unknown"} for n in names}
    if not names:
        return out
    text = run(["systemctl", "show", "--property=Id,Names,UnitFileState,ActiveState", "--", *names])
    for block, name in zip(text.split("\n\n"), names, strict=False):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        out[name] = {"enabled": props.get("UnitFileState") or "none", "active": props.get("ActiveState", "unknown")}
    return out


def read_sysctl(name: str) -> str | None:
    try:
        with open(at("/proc/sys/" + name.replace(".", "/"))) as handle:
            return " ".join(handle.read().split())
    except OSError:
        return None


def read_module(name: str) -> bool:
    return os.path.isdir(at("/sys/module/" + name.replace("-", "_")))


def derived(paths: list[str]) -> list[dict]:
    """The sysctl keys and kernel modules the managed files set."""
    found: list[dict] = []
    for path in paths:
        is_sysctl = path.startswith(SYSCTL_DIRS) and path.endswith(".conf")
        if not (is_sysctl or (path.startswith(MODULE_DIRS) and path.endswith(".conf"))):
            continue
        try:
            with open(at(path)) as handle:
                lines = [ln.strip() for ln in handle]
        except OSError:
            continue
        for line in lines:
            if not line or line.startswith(("#", ";")):
                continue
            if is_sysctl and "=" in line:
                found.append({"kind": "sysctl", "name": line.split("=", 1)[0].strip().lstrip("-")})
            elif not is_sysctl:
                found.append({"kind": "module", "name": line.split()[0]})
    return found


def held_packages() -> list[dict]:
    """Every package held on the node: the roles hold what they install with apt-mark, and a
    converged node's install tasks are skipped (probe, then act): read here, not from the run."""
    return [{"kind": "package", "name": name} for name, state in dpkg_states().items() if state["hold"]]


def earlier(scope: str | None) -> list[dict]:
    """The items of the manifest the node holds, when the same plays wrote it: a task that
    changed something on the first run is skipped on the next, and what it manages stays."""
    try:
        with open(at(MANIFEST), "rb") as handle:
            manifest = json.loads(handle.read())
        if manifest.get("format") == FORMAT and manifest.get("scope") == scope:
            return [{"kind": i["kind"], "name": i["name"]} for i in manifest["items"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return []


def states(items: list[dict]) -> list[dict]:
    """``items`` with the state of each now, sorted and without repeats."""
    unique = {(i["kind"], i["name"]): i for i in items}
    unique |= {(i["kind"], i["name"]): i for i in derived([n for k, n in unique if k == "path"])}
    keys = sorted(unique)
    packages = read_packages([n for k, n in keys if k == "package"])
    services = read_services([n for k, n in keys if k == "service"])
    out = []
    for kind, name in keys:
        if kind == "path":
            state = read_path(name)
        elif kind == "package":
            state = packages[name]
        elif kind == "service":
            state = services[name]
        elif kind == "sysctl":
            state = {"value": read_sysctl(name)}
        elif kind == "module":
            state = {"loaded": read_module(name)}
        else:
            continue
        out.append({"kind": kind, "name": name, "state": state})
    return out


# -- the inputs the plays depended on -------------------------------------------------------------
def inputs() -> dict:
    release = {}
    try:
        with open(at("/etc/os-release")) as handle:
            for line in handle:
                key, _, value = line.strip().partition("=")
                if key in ("ID", "VERSION_ID"):
                    release[key] = value.strip('"')
    except OSError:
        pass
    return {"kernel": os.uname().release if ROOT == "/" else "test", "os": release,
            "gpus": gpu_census(), "dkms": dkms_status()}


def gpu_census() -> list[str] | None:
    """``BUS MODEL`` of each GPU the loaded driver lists (/proc/driver/nvidia/gpus): what
    `nvidia-smi -L` lists, without starting it on every check. None: no driver loaded."""
    gpus = at("/proc/driver/nvidia/gpus")
    try:
        buses = sorted(os.listdir(gpus))
    except OSError:
        return None
    census = []  # (``nvidia-smi -L`` would start the driver's library on every check)
    for bus in buses:
        try:
            with open(os.path.join(gpus, bus, "information"), errors="replace") as handle:
                model = next((" ".join(v.split()) for k, _, v in (ln.partition(":") for ln in handle)
                              if k.strip() == "Model"), "unknown model")
        except OSError:
            model = "unreadable"
        census.append(f"{bus} {model}")
    return census


def dkms_status() -> list[str] | None:
    """`dkms status`'s lines read from DKMS's tree by its rules (added: a source; built: modules in
    KERNEL/ARCH/module; installed: M/kernel-KERNEL-ARCH links there), not by `dkms status`, which
    diffs each module with its installed copy (the NVIDIA driver's, tens of MB). None: no DKMS."""
    tree = at("/var/lib/dkms")
    if not os.path.isdir(tree):
        return None
    try:
        return _dkms_tree(tree)
    except OSError as exc:  # a tree changing under the check: drift, not a crash
        return [f"unreadable: {exc.strerror or exc}"]


def _dkms_tree(tree: str) -> list[str]:  # dkms_status's walk
    lines = []
    for module in sorted(m for m in os.listdir(tree) if not os.path.islink(os.path.join(tree, m))):
        mdir = os.path.join(tree, module)
        versions = os.listdir(mdir) if os.path.isdir(mdir) else []
        for version in sorted(v for v in versions if os.path.lexists(os.path.join(mdir, v, "source"))):
            built = []
            for kernel, arch in sorted((k, a) for k in os.listdir(os.path.join(mdir, version)) if k[:1].isdigit()
                                       for a in os.listdir(os.path.join(mdir, version, k))):
                where = os.path.join(mdir, version, kernel, arch)
                if os.path.isdir(os.path.join(where, "module")) and os.listdir(os.path.join(where, "module")):
                    link = os.path.join(mdir, f"kernel-{kernel}-{arch}")
                    state = "installed" if os.path.realpath(link) == os.path.realpath(where) else "built"
                    built.append(f"{module}/{version}, {kernel}, {arch}: {state}")
            lines += built or [f"{module}/{version}: added"]
    return sorted(lines)


# -- what drifted, in words -----------------------------------------------------------------------
# systemd's ActiveState, settled: a unit caught on its way up counts as running, one on its way
# down (or failed) as not. A node without a GPU starts the enabled nvidia-persistenced at boot and
# it fails there, so the state recorded at the end of a run may be `deactivating` and the next read
# `failed`: the same fact, not drift (CI failure of stop 71). Words still name the real states.
RUNNING_STATES = frozenset({"active", "reloading", "activating"})


def running(active_state: str) -> bool | str:
    """Whether a unit's ActiveState means running; an unknown state compares as itself."""
    if active_state in RUNNING_STATES:
        return True
    if active_state in ("inactive", "deactivating", "failed"):
        return False
    return active_state


def drift_of(item: dict, now: dict) -> list[str]:
    kind, name, was = item["kind"], item["name"], item["state"]
    if kind == "path":
        if was.get("exists") != now.get("exists"):
            return [f"{name}: missing" if was.get("exists") else f"{name}: exists (it was removed)"]
        words = []
        for key, label in (("type", "type"), ("target", "link target"), ("mode", "mode"), ("owner", "owner")):
            if was.get(key) != now.get(key):
                words.append(f"{name}: {label} {was.get(key)} -> {now.get(key)}")
        if was.get("sha256") != now.get("sha256") or now.get("error"):
            words.append(f"{name}: " + (f"unreadable ({now['error']})" if now.get("error") else "sha256 changed"))
        return words
    if kind == "package":
        if was["version"] != now["version"]:
            if now["version"] is None:
                return [f"package {name}: removed (was {was['version']})"]
            return [f"package {name}: {was['version'] or 'absent'} -> {now['version']}"]
        if was["hold"] != now["hold"]:
            return [f"package {name}: " + ("no longer held" if was["hold"] else "held (it was not)")]
        return []
    if kind == "service":
        words = []
        if running(was["active"]) != running(now["active"]):
            words.append(f"{name}: {now['active']} (was {was['active']})")
        if was["enabled"] != now["enabled"]:
            words.append(f"{name}: {now['enabled']} (was {was['enabled']})")
        return words
    if kind == "sysctl" and was["value"] != now["value"]:
        return [f"sysctl {name}: {was['value']} -> {now['value']}"]
    if kind == "module" and was["loaded"] != now["loaded"]:
        return [f"module {name}: " + ("not loaded" if was["loaded"] else "loaded (it was not)")]
    return []


def inputs_drift(was: dict, now: dict) -> list[str]:
    words = []
    if was.get("kernel") != now.get("kernel"):
        built = any(now["kernel"] in ln and "installed" in ln for ln in now.get("dkms") or [])
        note = "" if was.get("dkms") is None or built else ": DKMS module not built"
        words.append(f"kernel {was.get('kernel')} -> {now.get('kernel')}{note}")
    if was.get("os") != now.get("os"):
        words.append(f"OS {describe_os(was.get('os'))} -> {describe_os(now.get('os'))}")
    # No nvidia-smi (None) and no GPU listed ([]) are the same census; a removed nvidia-smi is
    # its package's drift.
    if (was.get("gpus") or []) != (now.get("gpus") or []):
        words.append(f"GPUs: {len(was.get('gpus') or [])} -> {len(now.get('gpus') or [])} "
                     f"({'; '.join(now.get('gpus') or []) or 'none answer'})")
    elif was.get("dkms") != now.get("dkms") and was.get("kernel") == now.get("kernel"):
        words.append("DKMS modules changed: " + "; ".join(now.get("dkms") or ["none"]))
    return words


def describe_os(release: dict | None) -> str:
    return " ".join(v for v in ((release or {}).get("ID"), (release or {}).get("VERSION_ID")) if v) or "unknown"


# -- the two commands ---------------------------------------------------------------------------
def canonical(data: dict) -> bytes:
    return (json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n").encode()


def snapshot(request: dict) -> dict:
    scope = request.get("scope")
    found = states([*request["items"], *earlier(scope), *held_packages()])
    manifest = {"format": FORMAT, "gpuprov": request["gpuprov"], "program": request["program"],
                "scope": scope, "items": found, "inputs": inputs()}
    data = canonical(manifest)
    path = at(MANIFEST)
    # The file is root's alone (0600). Its directory is made 0700 when missing, and otherwise
    # left as it is: the roles manage /var/lib/gpuprov (a change here would be drift).
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = f"{path}.tmp"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return {"digest": hashlib.sha256(data).hexdigest(), "items": len(found)}


def check(request: dict) -> dict:
    try:
        with open(at(MANIFEST), "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return {"state": "missing", "digest": None, "items": 0, "drift": [f"{MANIFEST}: missing"]}
    except OSError as exc:
        return {"state": "unreadable", "digest": None, "items": 0, "drift": [f"{MANIFEST}: {exc.strerror}"]}
    digest = hashlib.sha256(data).hexdigest()
    try:
        manifest = json.loads(data)
        items, was_inputs = manifest["items"], manifest["inputs"]
    except (ValueError, KeyError, TypeError):
        return {"state": "unreadable", "digest": digest, "items": 0, "drift": [f"{MANIFEST}: not a manifest"]}
    if (manifest.get("format"), manifest.get("gpuprov"), manifest.get("program")) != \
            (FORMAT, request["gpuprov"], request["program"]):
        return {"state": "other-version", "digest": digest, "items": len(items),
                "drift": [f"{MANIFEST}: written by gpuprov {manifest.get('gpuprov')} (this is {request['gpuprov']})"
                          if manifest.get("gpuprov") != request["gpuprov"] else
                          f"{MANIFEST}: written by another build of gpuprov {request['gpuprov']}"]}
    now = {(i["kind"], i["name"]): i["state"] for i in states(items)}
    words = inputs_drift(was_inputs, inputs())
    for item in items:
        words += drift_of(item, now.get((item["kind"], item["name"]), {}))
    return {"state": "drifted" if words else "held", "digest": digest, "items": len(items), "drift": words}


def main(argv: list[str]) -> int:
    global ROOT
    if len(argv) >= 2 and argv[0] == "--root":
        ROOT, argv = argv[1], argv[2:]
    if argv not in (["snapshot"], ["check"]):
        print("usage: manifest [--root DIR] snapshot|check  (a JSON request on stdin)", file=sys.stderr)
        return 2
    request = json.loads(sys.stdin.read())
    answer = snapshot(request) if argv == ["snapshot"] else check(request)
    sys.stdout.write(json.dumps(answer, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
