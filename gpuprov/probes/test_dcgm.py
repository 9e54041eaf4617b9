"""Probes for NVIDIA DCGM and dcgm-exporter (role dcgm): DCGM at the lock's version and held,
gpuprov's counters file turning on every field the alert rules read, the host engine enabled,
the exporter's unit running the lock's image by digest on one address; where a GPU is on the
PCI bus, the host engine running and the exporter answering."""

from __future__ import annotations

import re
import shlex
from fnmatch import fnmatch
from pathlib import Path

import pytest
import yaml

from gpuprov import paths, platforms
from gpuprov.defaults import DEFAULT_OS
from gpuprov.probes.nodefacts import (
    held_packages,
    installed_version,
    nvidia_pci,
    read_text,
    require_systemd,
    unit_state,
)

pytestmark = pytest.mark.dcgm

COUNTERS = "/etc/gpuprov/dcgm-exporter/counters.csv"
SERVICE = "nvidia-dcgm"
EXPORTER_UNIT = "gpuprov-dcgm-exporter.service"
ALERT_RULES = paths.roles_dir() / "monitoring" / "files" / "gpu-alerts.yml"
# dcgm-exporter's metric types (its collectors file: DCGM FIELD, type, help).
METRIC_TYPES = ("gauge", "counter", "label")
# Older names of a field that the alert rules match beside the current one: the counters file
# turns on the current name (NVIDIA/DCGM dcgm_fields.py: field 112).
OLDER_NAMES = {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"}
WILDCARDS = ("0.0.0.0", "::", "[::]", "*")
_FIELD = re.compile(r"DCGM_FI_[A-Z0-9_]+")
_NAME_RE = re.compile(r'__name__\s*=~\s*"([^"]*)"')


def parse_counters(text: str) -> dict[str, str]:
    """{DCGM field: metric type} of a dcgm-exporter collectors file; ValueError names the first
    line that is not ``DCGM_FI_..., gauge|counter|label, help`` (or a field listed twice)."""
    fields: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not _FIELD.fullmatch(parts[0]) or parts[1] not in METRIC_TYPES or not parts[2]:
            raise ValueError(f"line {number}: {line!r} is not 'DCGM_FI_..., {'|'.join(METRIC_TYPES)}, help'")
        if parts[0] in fields:
            raise ValueError(f"line {number}: {parts[0]} listed twice")
        fields[parts[0]] = parts[1]
    return fields


def _split_top(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "|" and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def expand_names(pattern: str) -> list[str]:
    """The names a metric-name regex of the rules matches: literal names with ``|`` and groups
    only (``A_(B|C)_D|E``); anything else is refused (ValueError), never guessed."""
    out: list[str] = []
    for alternative in _split_top(pattern):
        open_at = alternative.find("(")
        if open_at < 0:
            if not re.fullmatch(r"[A-Za-z0-9_:]+", alternative):
                raise ValueError(f"cannot read the metric-name regex {pattern!r}")
            out.append(alternative)
            continue
        depth = 0
        for close_at in range(open_at, len(alternative)):
            depth += {"(": 1, ")": -1}.get(alternative[close_at], 0)
            if depth == 0:
                break
        else:
            raise ValueError(f"unbalanced group in {pattern!r}")
        head, inner, tail = alternative[:open_at], alternative[open_at + 1:close_at], alternative[close_at + 1:]
        tails = expand_names(tail) if tail else [""]
        out += [head + a + b for a in expand_names(inner) for b in tails]
    return out


def alert_fields(rules_text: str) -> set[str]:
    """Every DCGM_FI_* metric the alert rules read, by its current DCGM name: bare names and
    those a ``{__name__=~"..."}`` selector matches."""
    found: set[str] = set()
    for group in (yaml.safe_load(rules_text) or {}).get("groups", []):
        for rule in group.get("rules", []):
            expr = str(rule.get("expr", ""))
            for pattern in _NAME_RE.findall(expr):
                found.update(n for n in expand_names(pattern) if n.startswith("DCGM_FI_"))
            found.update(_FIELD.findall(_NAME_RE.sub("", expr)))
    return {OLDER_NAMES.get(name, name) for name in found}


def _dcgm_lock(expect) -> dict:
    lock = expect.lock()
    if not lock.get("dcgm"):
        os = platforms.get(lock.get("os") or DEFAULT_OS)
        pytest.skip(f"package source {lock.get('source')!r} carries no DCGM ({os.distribution} {os.version}'s "
                    "archive has none): nothing installed; DCGM comes with source nvidia or mirror")
    return lock


def _gpus(host) -> int:
    return nvidia_pci(host)["gpus"]


def test_dcgm_matches_the_lock_and_is_held(host, expect, report):
    lock = _dcgm_lock(expect)
    package, pattern = lock["dcgm_package"], lock["dcgm_package_version"]
    version = installed_version(host, package)
    assert version and fnmatch(version, pattern), (
        f"expected {package} at {pattern} (DCGM {lock['dcgm']}, the lock's), found {version}")
    held = held_packages(host)
    assert package in held, f"expected {package} held (it moves only with the lock), not held"
    report(f"{package} {version}, held")


def test_dcgm_counters_file_turns_on_every_field_the_alerts_read(host, expect, report):
    _dcgm_lock(expect)
    counters = read_text(host, COUNTERS)
    assert counters is not None, f"expected gpuprov's dcgm-exporter counters file {COUNTERS}"
    fields = parse_counters(counters)
    wanted = alert_fields(Path(ALERT_RULES).read_text())
    missing = sorted(wanted - set(fields))
    assert not missing, f"{COUNTERS} leaves out fields the alert rules read: {missing}"
    report(f"{len(fields)} fields on, the {len(wanted)} the alert rules read among them")


def test_dcgm_host_engine_enabled_and_running_with_a_gpu(host, expect, report):
    lock = _dcgm_lock(expect)
    require_systemd(host)
    service = unit_state(host, SERVICE)
    assert service.is_enabled, f"expected {SERVICE} enabled (DCGM {lock['dcgm']}), found {service}"
    gpus = _gpus(host)
    if gpus == 0:
        pytest.skip(f"no NVIDIA GPU on this node's PCI bus: {SERVICE} is enabled, not started "
                    "(nv-hostengine has nothing to manage)")
    assert service.is_running, f"expected {SERVICE} running ({gpus} GPU(s) on the PCI bus), found {service}"
    report(f"{SERVICE} enabled and running, {gpus} GPU(s)")


def exporter_unit(text: str) -> dict[str, str]:
    """The image, address and port an exporter unit's ExecStart runs (continuations joined)."""
    command = re.search(r"^ExecStart=(.*)$", text.replace("\\\n", " "), re.M)
    words = shlex.split(command.group(1)) if command else []
    published = next((words[i + 1] for i, w in enumerate(words[:-1]) if w in ("--publish", "-p")), "")
    match = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^:]+):(\d+):\d+", published)
    return {"image": next((w for w in words if "@sha256:" in w), ""),
            "address": match.group(1) if match else "", "port": match.group(2) if match else ""}


def test_dcgm_exporter_runs_the_locked_image_on_one_address(host, expect, report):
    lock = _dcgm_lock(expect)
    unit = read_text(host, f"/etc/systemd/system/{EXPORTER_UNIT}")
    assert unit is not None, f"expected the dcgm-exporter unit {EXPORTER_UNIT}"
    found = exporter_unit(unit)
    digest = lock["dcgm_exporter_image"].rsplit("@", 1)[-1]
    assert found["image"].endswith("@" + digest), (
        f"expected the exporter run by the lock's digest {digest}, found {found['image'] or 'none'}")
    assert found["address"] and found["address"] not in WILDCARDS, (
        f"expected the exporter's port published on one address, found '{found['address']}'")
    where = f"{found['address']}:{found['port']}"
    gpus = _gpus(host)
    if gpus == 0:
        pytest.skip(f"no NVIDIA GPU on this node's PCI bus: {EXPORTER_UNIT} is installed ({where}), "
                    "not started (dcgm-exporter would have nothing to read)")
    require_systemd(host)
    exporter = unit_state(host, EXPORTER_UNIT)
    assert exporter.is_running, f"expected {EXPORTER_UNIT} running ({gpus} GPU(s)), found {exporter}"
    url = f"http://{where}/metrics"
    page = host.run("python3 -c " + shlex.quote(
        "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10)"
        ".read().decode())") + " " + shlex.quote(url))
    assert page.rc == 0 and "DCGM_FI_DEV_GPU_TEMP" in page.stdout, (
        f"expected dcgm-exporter's metrics at {url}: {(page.stderr or page.stdout)[-300:]}")
    report(f"dcgm-exporter answers at {url}, {gpus} GPU(s)")
