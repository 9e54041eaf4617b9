"""gpuprov's quick health on the node itself (slurmd's HealthCheckProgram): the zipapp gpuprov
builds of its own health modules, run here with the machine's `python3 -I -S` in a subprocess
(no site-packages: the standard library only), judges a recorded gather output exactly as
`gpuprov health` does in process (the same code, so the same verdicts), on the real H100 and
H200 recordings and on their copies edited to show one fault each. Then the slurm role's
health program, as slurmd runs it: the zipapp's failing checks join the services', and the
node is drained with them as its one-line Reason (scontrol here is a stand-in that records what
it was asked)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpuprov.health import QUICK, evaluate, gather, node_bundle, node_check
from gpuprov.health.facts import Expect, Facts
from gpuprov.health.gather import MARK, Section
from gpuprov.results.shapes import serialise
from tests.fixtures.health_recordings import EDITED, LOCK, REC, sections
from tests.unit.node_programs import load_health_program

# The node's Python, as the slurm role's program runs the zipapp (python3 on the node's PATH).
PYTHON3 = shutil.which("python3") or sys.executable
NODE = "n1"


def wire(found: dict[str, Section]) -> str:
    """Sections as the gather script prints them (gather.script: a marker line, the output, an
    exit-status line)."""
    return "".join(f"{MARK} {name}\n{s.text}\n{MARK}-rc {name} {s.rc}\n" for name, s in found.items())


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return node_bundle.write(tmp_path_factory.mktemp("pyz"))


def run_pyz(pyz: Path, expect: Expect, output: str, tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    (tmp / "expect.json").write_text(json.dumps(node_check.expect_data(expect)))
    (tmp / "gather.txt").write_text(output)
    # -I: no PYTHONPATH, no user site, not the current directory; -S: no site-packages. Run
    # from an empty directory with gpuprov's checkout nowhere on the path.
    cwd = tmp / "cwd"
    cwd.mkdir(exist_ok=True)
    return subprocess.run([PYTHON3, "-I", "-S", str(pyz), "--expect", str(tmp / "expect.json"),
                           "--recorded-gather-output", str(tmp / "gather.txt"), *extra],
                          capture_output=True, text=True, check=False, timeout=60, cwd=cwd,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"})


def on_node(pyz: Path, expect: Expect, found: dict[str, Section], tmp: Path) -> tuple[int, dict[str, Any]]:
    proc = run_pyz(pyz, expect, wire(found), tmp, "--json")
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def in_process(expect: Expect, found: dict[str, Section], node: str) -> list[dict[str, Any]]:
    return serialise(evaluate(node, Facts(found), expect, "quick"))


def expect_of(model: str) -> Expect:
    return Expect(gpus=1, gpu_model=model, lock=LOCK, provision="gpuprov provision c1")


@pytest.mark.parametrize(("machine", "model"), [("h100-sxm5-580", "H100"), ("h200-580", "H200")])
def test_the_node_program_passes_a_healthy_recording_as_gpuprov_health_does(pyz, tmp_path, machine, model) -> None:
    found = sections(machine, {})
    assert gather.split(wire(found)) == found  # the recording, as the script prints it
    rc, data = on_node(pyz, expect_of(model), found, tmp_path)
    assert rc == 0 and data["ok"] is True
    assert data["checks"] == in_process(expect_of(model), found, data["node"])
    assert len(data["checks"]) == len(QUICK)
    assert {r["status"] for r in data["checks"]} == {"pass", "skip"}
    assert all(r["reason"] for r in data["checks"] if r["status"] == "skip")


@pytest.mark.parametrize(("check", "swap", "found_text", "action"), EDITED, ids=lambda v: str(v)[:40])
def test_the_node_program_fails_exactly_what_gpuprov_health_fails(pyz, tmp_path, check, swap, found_text,
                                                                   action) -> None:
    found = sections("h100-sxm5-580", {k: REC / v for k, v in swap.items()})
    rc, data = on_node(pyz, expect_of("H100"), found, tmp_path)
    mine = in_process(expect_of("H100"), found, data["node"])
    assert rc == 1 and data["ok"] is False
    assert data["checks"] == mine
    failing = {r["check"]: r for r in data["checks"] if r["status"] == "fail"}
    assert check in failing and found_text in failing[check]["found"] and action in failing[check]["action"]
    assert set(failing) == {r["check"] for r in mine if r["status"] == "fail"}


def test_the_node_program_prints_each_row_as_gpuprov_health_does(pyz, tmp_path) -> None:
    swap = {"kernel_log": REC / "h100-sxm5-580-edited-xid/dmesg-xid79.txt"}
    proc = run_pyz(pyz, expect_of("H100"), wire(sections("h100-sxm5-580", swap)), tmp_path)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    xid = next(line for line in lines if line.startswith("FAIL xid: "))
    assert "Xid 79 on 0000:00:06 x1" in xid and " -> drain and reboot the node" in xid
    assert "SKIP nvlink: one GPU: no NVLink peer" in lines
    assert lines[-1].endswith(": 8 pass, 1 fail, 4 skip"), lines[-1]


def test_a_cut_off_script_fails_naming_where_it_stopped(pyz, tmp_path) -> None:
    """What the script printed before it was cut off is judged as `gpuprov health` judges it,
    and the cut-off is one more failure naming the section it stopped in."""
    text = wire(sections("h100-sxm5-580", {}))
    cut = text[: text.index(f"{MARK} smi_q\n") + len(f"{MARK} smi_q\n")] + "partial line\n"
    rows = node_check.check(expect_of("H100"), cut, "not finished within 5 s", NODE)
    assert rows[:-1] == evaluate(NODE, Facts(gather.split(cut)), expect_of("H100"), "quick")
    assert rows[-1].check == "gather" and rows[-1].status == "fail"
    assert rows[-1].found == "the health script was not finished within 5 s, in its smi_q section"


def test_the_expect_is_data_read_back_as_it_was_written(pyz, tmp_path) -> None:
    expect = Expect(instance_type="p5.48xlarge", gpus=8, gpu_model="H100", nvswitch=True, efa_interfaces=32,
                    lock={"driver": "580.159.04", "packages": {"driver": ["nvidia-driver"]}},
                    provision="gpuprov provision {{ lookup('pipe', 'id') }}")
    assert node_check.load_expect(json.loads(json.dumps(node_check.expect_data(expect)))) == expect
    for bad, why in (({"gpus": "8"}, "gpus: str"), ({"gpus": True}, "gpus: bool"), ({"cmd": "x"}, "unknown field"),
                     ([], "a JSON object")):
        with pytest.raises(ValueError, match=why):
            node_check.load_expect(bad)
    (tmp_path / "bad.json").write_text(json.dumps({"nvswitch": "yes"}))
    proc = subprocess.run([PYTHON3, "-I", "-S", str(pyz), "--expect", str(tmp_path / "bad.json")],
                          capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 2 and "nvswitch: str is not one of bool, NoneType" in proc.stderr, proc.stderr
    assert proc.stdout == ""


def test_the_zipapp_is_the_same_bytes_each_build_and_needs_only_the_standard_library(pyz, tmp_path) -> None:
    assert node_bundle.build() == node_bundle.build() == pyz.read_bytes()
    again = node_bundle.write(tmp_path)
    assert hashlib.sha256(again.read_bytes()).digest() == hashlib.sha256(pyz.read_bytes()).digest()
    mtime = again.stat().st_mtime_ns
    time.sleep(0.01)
    assert node_bundle.write(tmp_path).stat().st_mtime_ns == mtime  # the same bytes: not rewritten
    with zipfile.ZipFile(pyz) as zf:
        infos = zf.infolist()
    names = [i.filename for i in infos]
    assert names == sorted(names) and names[0] == "__main__.py"
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
    assert {i.external_attr >> 16 for i in infos} == {0o100644}
    assert "gpuprov/catalog/instance_types.json" in names and not any("__pycache__" in n for n in names)
    # Every module the node program loads is gpuprov's own (from the zipapp) or the standard
    # library's, whatever is installed beside this Python.
    probe = ("import sys, runpy; sys.argv = ['x', '--expect', '/nonexistent/expect.json']\n"
             "try:\n    runpy.run_path(PYZ, run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "import gpuprov.health.node_check\n"
             "mods = {m.split('.')[0] for m in sys.modules}\n"
             "print('\\n'.join(sorted(m for m in mods if m not in sys.stdlib_module_names)))\n"
             "print('FROM', gpuprov.__file__)\n").replace("PYZ", repr(str(pyz)))
    proc = subprocess.run([PYTHON3, "-I", "-S", "-c", probe], capture_output=True, text=True, check=False,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    *outside, origin = proc.stdout.splitlines()
    assert outside == ["__main__", "gpuprov"], outside  # (__main__: the probe itself)
    assert origin == f"FROM {pyz}/gpuprov/__init__.py"
    # The nvlink table is read from the archive's own data file.
    proc = subprocess.run([PYTHON3, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {str(pyz)!r}); "
                           "from gpuprov.health.facts import nvlink_table; print(nvlink_table()['p5.48xlarge'])"],
                          capture_output=True, text=True, check=False, timeout=60, cwd=tmp_path)
    assert proc.stdout.strip() == "18", proc.stderr


def test_the_play_gets_the_zipapp_and_each_nodes_expect_as_gpuprov_health_makes_it(tmp_path) -> None:
    from gpuprov.providers import get
    from gpuprov.state import NodeRecord

    provider = get("docker")
    nodes = [NodeRecord(name=n, id=n, address="127.0.0.1", ssh_port=22, user="gpuprov", state="running",
                        instance_type=t) for n, t in (("a", "docker-node"), ("b", "p5.48xlarge"))]
    lock = {"driver": "580.159.04", "fabricmanager": "580.159.04"}
    expected = node_bundle.expectations("c1", provider, nodes, lock)
    assert expected == {n.name: Expect.of(provider.expectations(n), lock, "gpuprov provision c1") for n in nodes}
    assert expected["b"].gpus == 8 and expected["b"].efa_interfaces == 32 and expected["b"].nvswitch is True
    found = node_bundle.play_vars(tmp_path, expected)
    assert found["gpuprov_node_health_pyz"] == str(tmp_path / "node-health.pyz")
    assert Path(found["gpuprov_node_health_pyz"]).read_bytes() == node_bundle.build()
    assert (tmp_path / "node-health.pyz").stat().st_mode & 0o777 == 0o644
    assert {n: node_check.load_expect(d) for n, d in found["gpuprov_node_health_expect"].items()} == expected


# -- the slurm role's health program, as slurmd runs it ---------------------------------------
def _program() -> ModuleType:
    return load_health_program()


def _here(expect: Expect) -> list[tuple[str, str]]:
    """The quick level's failures on this machine, in process (the gather script run here)."""
    proc = subprocess.run(["sh", "-s"], input=gather.script("quick"), capture_output=True, text=True,
                          check=False, timeout=gather.BUDGET_S["quick"])
    return [(r.check, r.found) for r in evaluate(NODE, Facts(gather.split(proc.stdout)), expect, "quick")
            if r.status == "fail"]


P5 = Expect(instance_type="p5.48xlarge", gpus=8, gpu_model="H100", nvswitch=True, efa_interfaces=32,
            lock={"driver": "580.159.04"}, provision="gpuprov provision c1")


def _config(tmp: Path, pyz: Path, expect: Expect) -> dict[str, Any]:
    (tmp / "expect.json").write_text(json.dumps(node_check.expect_data(expect)))
    return {"services": [], "gpus": 0, "node_check": str(pyz), "expect": str(tmp / "expect.json")}


def test_the_program_adds_the_quick_levels_failures_on_this_machine(pyz, tmp_path) -> None:
    """Run here for real (no GPU on this machine): held to a p5's eight H100s, the program's
    failures are exactly what the quick level finds in process; a check that skips is none."""
    program = _program()
    found = program.failures(_config(tmp_path, pyz, P5), time.monotonic())
    assert found == _here(P5)
    assert found[0] == ("gpu_count", "0 NVIDIA GPU(s) on the PCI bus")
    docker_node = Expect(instance_type="docker-node", gpus=0)
    assert program.failures(_config(tmp_path, pyz, docker_node), time.monotonic()) == _here(docker_node)


def test_the_program_without_gpuprovs_zipapp_keeps_its_own_checks_and_a_broken_one_says_so(pyz, tmp_path) -> None:
    program = _program()
    assert program.failures({"services": [], "gpus": 0}, time.monotonic()) == []
    broken = {**_config(tmp_path, pyz, P5), "node_check": str(tmp_path / "missing.pyz")}
    ((check, detail),) = program.failures(broken, time.monotonic())
    assert check == "node_check" and detail.startswith("gpuprov's quick health did not answer (exit 2)"), detail
    assert program.failures({**broken, "node_check": "relative.pyz"}, time.monotonic()) == [
        ("node_check", "the health config names no zipapp and Expect file")]


def test_the_program_drains_with_the_failures_as_one_short_printable_line(pyz, tmp_path, monkeypatch) -> None:
    """main() as slurmd runs it: scontrol (a stand-in that logs its arguments) says the node is
    idle; the program drains it, the Reason its failing checks, printable, at most 200 chars."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "scontrol.log"
    (bin_dir / "scontrol").write_text(
        "#!/bin/sh\nprintf '%s\\n' \"$*\" >> " + str(log) + "\n"
        "[ \"$1\" = show ] && echo \"NodeName=$3 State=IDLE Reason=\"\nexit 0\n")
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    config = tmp_path / "health.json"
    config.write_text(json.dumps(_config(tmp_path, pyz, P5)))
    program = _program()
    monkeypatch.setattr(program, "CONFIG", str(config))
    assert program.main() == 0
    update = [line for line in log.read_text().splitlines() if line.startswith("update ")]
    assert len(update) == 1, log.read_text()
    reason = update[0].split(" reason=", 1)[1]
    assert reason.startswith("gpuprov health: gpu_count: 0 NVIDIA GPU(s) on the PCI bus"), reason
    assert len(reason) <= 200 and reason.isprintable()
    want = "gpuprov health: " + "; ".join(f"{c}: {d}" for c, d in _here(P5))
    assert reason == "".join(c if c.isprintable() else "?" for c in want)[:200]

