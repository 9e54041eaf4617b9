"""gpuprov's dcgm-exporter counters file (roles/dcgm/files/counters.csv) parses as dcgm-exporter's
collectors CSV and turns on every DCGM_FI_* metric the monitoring role's alert rules read, plus
the fields the dcgm role promises (temperature, power, retired pages, row remap, Xid, clocks
event reasons)."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import pytest
import yaml

from gpuprov.probes.test_dcgm import alert_fields, expand_names, parse_counters

ROOT = Path(__file__).resolve().parents[2]
COUNTERS = ROOT / "roles" / "dcgm" / "files" / "counters.csv"
ALERTS = ROOT / "roles" / "monitoring" / "files" / "gpu-alerts.yml"
PROMISED = {
    "temperature": {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP"},
    "power": {"DCGM_FI_DEV_POWER_USAGE"},
    "ecc": {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"},
    "retired pages": {"DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_RETIRED_PENDING"},
    "row remap": {"DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_PENDING",
                  "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"},
    "xid": {"DCGM_FI_DEV_XID_ERRORS"},
    "clocks event reasons": {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS"},
    "nvlink errors": {f"DCGM_FI_DEV_NVLINK_{k}_ERROR_COUNT_TOTAL" for k in ("CRC_FLIT", "CRC_DATA", "REPLAY", "RECOVERY")},
}


def _rows() -> list[list[str]]:
    """The file as dcgm-exporter reads it: a CSV reader that skips '#' comment lines and trims
    the space after each comma (Go's encoding/csv with Comment '#', TrimLeadingSpace)."""
    lines = [ln for ln in COUNTERS.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return [[cell.strip() for cell in row] for row in csv.reader(io.StringIO("\n".join(lines)), skipinitialspace=True)]


def test_counters_file_parses_as_dcgm_exporters_csv() -> None:
    rows = _rows()
    assert rows, "no field turned on"
    bad = [row for row in rows if len(row) != 3 or not re.fullmatch(r"DCGM_FI_[A-Z0-9_]+", row[0])
           or row[1] not in ("gauge", "counter", "label") or not row[2]]
    assert bad == [], f"rows that are not 'DCGM_FI_..., gauge|counter|label, help': {bad}"
    names = [row[0] for row in rows]
    assert len(names) == len(set(names)), "a field listed twice"
    # The probe's parser reads the file the same way.
    assert parse_counters(COUNTERS.read_text()) == {row[0]: row[1] for row in rows}


def test_every_alert_metric_is_turned_on() -> None:
    wanted = alert_fields(ALERTS.read_text())
    # The rules' reader finds what the rule file is known to use (it would otherwise pass vacuously).
    assert wanted >= {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                      "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
                      "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", *PROMISED["nvlink errors"]}
    # Every DCGM_FI_ name written in the rule file (its comments included) is one the reader
    # saw or a part of a name a group expands.
    written = set(re.findall(r"DCGM_FI_[A-Z0-9_]*[A-Z0-9]", ALERTS.read_text()))
    unread = {n for n in written if n not in wanted and not any(w.startswith(n) for w in wanted)}
    assert unread <= {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"}, unread
    on = {row[0] for row in _rows()}
    assert sorted(wanted - on) == [], "the alert rules read fields the counters file leaves off"


@pytest.mark.parametrize("what", sorted(PROMISED))
def test_the_promised_fields_are_on(what: str) -> None:
    on = {row[0] for row in _rows()}
    assert sorted(PROMISED[what] - on) == [], what


def test_the_header_names_the_source_of_the_field_names() -> None:
    header = "\n".join(ln for ln in COUNTERS.read_text().splitlines() if ln.startswith("#"))
    assert "NVIDIA/dcgm-exporter etc/default-counters.csv" in header
    assert "NVIDIA/DCGM testing/python3/dcgm_fields.py" in header


def test_the_readers_refuse_what_they_cannot_read() -> None:
    assert expand_names("A_(B|C)_D|E") == ["A_B_D", "A_C_D", "E"]
    with pytest.raises(ValueError):
        expand_names("DCGM_FI_DEV_.*")
    with pytest.raises(ValueError, match="line 2"):
        parse_counters("# comment\nDCGM_FI_DEV_GPU_TEMP, histogram, no such type\n")
    with pytest.raises(ValueError, match="twice"):
        parse_counters("DCGM_FI_DEV_GPU_TEMP, gauge, a\nDCGM_FI_DEV_GPU_TEMP, gauge, b\n")
    rules = 'groups: [{rules: [{expr: "{__name__=~\\"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS|X_Y\\"} > 0"}]}]'
    assert alert_fields(rules) == {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS"}


@pytest.mark.parametrize(("address", "host"), [("10.0.0.5", "10.0.0.5"), ("fd00::5", "[fd00::5]")])
def test_the_exporter_unit_runs_the_digest_on_one_address(address: str, host: str) -> None:
    """The role's unit template, rendered as the role renders it, publishes the port on the one
    address and runs the image by digest, read back the way the probe reads the node's unit."""
    import jinja2

    from gpuprov.probes.test_dcgm import exporter_unit

    role_vars = yaml.safe_load((ROOT / "roles" / "dcgm" / "vars" / "main.yml").read_text())
    digest = "sha256:" + "a" * 64
    template = (ROOT / "roles" / "dcgm" / "templates" / "gpuprov-dcgm-exporter.service.j2").read_text()
    text = jinja2.Template(template, undefined=jinja2.StrictUndefined).render(
        ansible_managed="managed", dcgm_service="nvidia-dcgm", dcgm_exporter_port=9400,
        __dcgm_exporter_host=host, __dcgm_exporter_ref=f"registry.invalid/nvidia/dcgm-exporter@{digest}",
        **{k: v for k, v in role_vars.items() if not str(v).startswith("{{")})
    found = exporter_unit(text + "\n")
    assert found == {"image": f"registry.invalid/nvidia/dcgm-exporter@{digest}", "address": host, "port": "9400"}
    assert "0.0.0.0" not in text and "--runtime nvidia --gpus all" in text and ":ro" in text


@pytest.mark.parametrize(("os", "archive"), [(None, "Debian 12's archive"), ("debian12", "Debian 12's archive"),
                                             ("debian13", "Debian 13's archive")])
def test_a_lock_without_dcgm_skips_naming_its_own_os(os: str | None, archive: str) -> None:
    """The skip reason names the archive of the lock's OS (a Debian 13 node's said Debian 12's once)."""
    from types import SimpleNamespace

    from gpuprov.probes.test_dcgm import _dcgm_lock

    lock = {"source": "distro", "dcgm": None, **({"os": os} if os else {})}
    with pytest.raises(pytest.skip.Exception) as skipped:
        _dcgm_lock(SimpleNamespace(lock=lambda: lock))
    assert f"package source 'distro' carries no DCGM ({archive} has none)" in str(skipped.value)
