"""Review 4, item 9: a damaged local file is one line naming it and what to do, exit 2, never
"internal error": the price cache (`types`, with or without --spot, and `list`), the catalog
cache, a cluster's recorded spec that is not a JSON object, a page of the state database
damaged after it was opened (`list`, `status`). A state directory found open to others is
made 0700 (state.db 0600), or refused with why."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from gpuprov import catalog
from gpuprov.cli.app import main
from gpuprov.state import Store

REGION = "us-east-1"
RECORD = {"InstanceType": "p5.48xlarge", "GpuInfo": {"Gpus": [{"Name": "H100", "Count": 8,
                                                               "MemoryInfo": {"SizeInMiB": 81920}}]},
          "VCpuInfo": {"DefaultVCpus": 192}, "MemoryInfo": {"SizeInMiB": 2097152},
          "NetworkInfo": {"EfaSupported": True, "EfaInfo": {"MaximumEfaInterfaces": 32}, "MaximumNetworkCards": 32}}


def invoke(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def _one_line(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    (line,) = err.strip().splitlines()
    assert "internal error" not in line
    for needle in needles:
        assert needle in line, line


def _write(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.mark.parametrize("cache", [
    {"on_demand": [1]}, {"spot": [1]}, {"on_demand": {"p5.48xlarge": 5}}, {"on_demand": {"p5.48xlarge": {"usd": "x"}}},
    {"spot": {"p5.48xlarge": {"fetched": "t", "zones": [1]}}},
    {"spot": {"p5.48xlarge": {"fetched": "t", "zones": {"us-east-1a": {"usd": -1, "since": "t"}}}}},
    [1], "not json {",
])
@pytest.mark.parametrize("spot", [False, True])
def test_a_damaged_price_cache_is_one_line_naming_it(capsys, gpuprov_home: Path, cache: object, spot: bool) -> None:
    path = _write(gpuprov_home / "pricing" / f"{REGION}.json", cache)
    code, out, err = invoke(capsys, "types", "--region", REGION, *(["--spot"] if spot else []))
    _one_line(code, err, f"price cache {path} is damaged", "delete it", f"--refresh --region {REGION}")
    assert out == "" and path.read_text() == (cache if isinstance(cache, str) else json.dumps(cache))


def test_a_good_price_cache_still_answers(capsys, gpuprov_home: Path) -> None:
    _write(gpuprov_home / "pricing" / f"{REGION}.json",
           {"on_demand": {"p5.48xlarge": {"usd": 55.04, "fetched": "2026-11-01T00:00:00Z"}},
            "spot": {"p5.48xlarge": {"fetched": "t", "zones": {"us-east-1a": {"usd": 20.5, "since": "t"}}}}})
    for spot, figure in ((False, 55.04), (True, 20.5)):
        code, out, err = invoke(capsys, "types", "-o", "json", "--region", REGION, *(["--spot"] if spot else []))
        assert code == 0, err
        (row,) = [r for r in json.loads(out) if r["instance_type"] == "p5.48xlarge"]
        assert row["price"]["usd_per_hour"] == figure


def test_a_damaged_price_cache_is_replaced_by_the_next_refresh(gpuprov_home: Path) -> None:
    from gpuprov.pricing import prices

    _write(prices.cache_file(REGION), {"on_demand": [1]})
    prices.record_on_demand(REGION, {"p5.48xlarge": 55.04})
    assert prices.read_cache(REGION)["on_demand"]["p5.48xlarge"]["usd"] == 55.04


@pytest.mark.parametrize("record", [
    {**RECORD, "GpuInfo": [1]}, {**RECORD, "GpuInfo": {"Gpus": "many"}}, {**RECORD, "NetworkInfo": [1]},
    {**RECORD, "VCpuInfo": {"DefaultVCpus": "192"}}, {**RECORD, "GpuInfo": {"Gpus": [{"Count": 1e999}]}},
    {"GpuInfo": {}}, [1],
])
def test_a_damaged_catalog_cache_is_one_line_naming_it(capsys, gpuprov_home: Path, record: object) -> None:
    path = _write(gpuprov_home / "catalog" / f"ec2-{REGION}.json",
                  {"types": {"p5.48xlarge": {"fetched": 1e12, "record": record}}})
    code, out, err = invoke(capsys, "types", "--region", REGION)
    _one_line(code, err, f"catalog cache {path} is damaged", "delete it", f"--refresh --region {REGION}")
    assert out == ""


@pytest.mark.parametrize("data", [[], {"types": []}, {"types": {"p5.48xlarge": []}},
                                  {"types": {"p5.48xlarge": {"fetched": "x", "record": RECORD}}}, "{"])
def test_a_catalog_cache_of_another_shape_is_one_line_naming_it(capsys, gpuprov_home: Path, data: object) -> None:
    path = _write(gpuprov_home / "catalog" / f"ec2-{REGION}.json", data)
    code, _, err = invoke(capsys, "types")  # every cached region is read
    _one_line(code, err, f"catalog cache {path} is damaged", "delete it")


def test_a_good_catalog_cache_still_answers_and_a_bad_live_record_is_left_out(gpuprov_home: Path) -> None:
    found = catalog.record_api_types(REGION, [RECORD, {**RECORD, "InstanceType": "p9.x", "GpuInfo": [1]}])
    assert [t.name for t in found] == ["p5.48xlarge"]
    cached = catalog.cached_types(REGION)
    assert set(cached) == {"p5.48xlarge"} and cached["p5.48xlarge"].gpu_count == 8
    assert cached["p5.48xlarge"].efa_max_interfaces == 32 and cached["p5.48xlarge"].vcpus == 192


def _store_with_a_cluster(home: Path) -> Path:
    home.mkdir(parents=True, mode=0o700)
    store = Store(home / "state.db")
    store.create_cluster("c1", "docker", {"count": 1})
    conn = sqlite3.connect(store.path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return store.path


@pytest.mark.parametrize("spec", ["[]", "5", '"text"', "null", "{"])
@pytest.mark.parametrize("command", [["list"], ["status", "c1"]])
def test_a_recorded_spec_that_is_not_a_json_object_is_one_line(capsys, gpuprov_home: Path, spec: str,
                                                               command: list[str]) -> None:
    db = _store_with_a_cluster(gpuprov_home)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE clusters SET spec = ?", (spec,))
    conn.commit()
    conn.close()
    code, out, err = invoke(capsys, *command)
    _one_line(code, err, f"state database {db} is damaged", "restore it from a backup")
    assert out == ""


@pytest.mark.parametrize("command", [["list"], ["status", "c1"]])
def test_a_database_page_damaged_after_open_is_one_line(capsys, gpuprov_home: Path, command: list[str]) -> None:
    db = _store_with_a_cluster(gpuprov_home)
    root = sqlite3.connect(db).execute("SELECT rootpage FROM sqlite_master WHERE name = 'clusters'").fetchone()[0]
    with db.open("r+b") as f:  # the clusters table's page: the header (page 1) still opens
        f.seek(4096 * (root - 1))
        f.write(b"\xff" * 4096)
    code, out, err = invoke(capsys, *command)
    _one_line(code, err, f"state database {db} is damaged (database disk image is malformed)",
              "restore it from a backup", "move it aside")
    assert out == ""


def test_a_state_directory_open_to_others_is_made_0700_and_the_database_0600(capsys, gpuprov_home: Path) -> None:
    db = _store_with_a_cluster(gpuprov_home)
    os.chmod(gpuprov_home, 0o755)
    os.chmod(db, 0o644)
    code, _, err = invoke(capsys, "list")
    assert code == 0, err
    assert gpuprov_home.stat().st_mode & 0o777 == 0o700 and db.stat().st_mode & 0o777 == 0o600


def test_a_new_database_is_0600(capsys, gpuprov_home: Path) -> None:
    """Made by the first write, 0600 whatever the umask; a command that only reads (`list` on a
    new machine) makes none."""
    from gpuprov.state import Store

    old = os.umask(0o022)
    try:
        code, _, err = invoke(capsys, "list")
        assert code == 0, err
        assert not (gpuprov_home / "state.db").exists()
        Store().create_cluster("first", "docker", {})
    finally:
        os.umask(old)
    assert (gpuprov_home / "state.db").stat().st_mode & 0o777 == 0o600
    assert [c.name for c in Store().list_clusters()] == ["first"]


def test_a_state_directory_that_cannot_be_made_0700_is_refused_with_why(capsys, gpuprov_home: Path,
                                                                       monkeypatch) -> None:
    gpuprov_home.mkdir(mode=0o755)
    os.chmod(gpuprov_home, 0o755)

    def refuse(path: object, mode: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "chmod", refuse)
    code, out, err = invoke(capsys, "list")
    assert code == 1 and out == ""
    (line,) = err.strip().splitlines()
    assert f"{gpuprov_home} is open to other users (mode 0755) and cannot be made 0700" in line
    assert "Operation not permitted" in line and not (gpuprov_home / "state.db").exists()
