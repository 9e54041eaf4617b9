"""Elastic Slurm's names, checks and power requests (gpuprov.slurm.elastic), and the power
program slurmctld runs (roles/slurm/files/gpuprov-slurm-power) sending a real request over HTTP
on loopback to a server that checks it with gpuprov's own verify. The hostlist is the one
slurmctld 22.05.8 passed its programs in the recorded run (tests/fixtures/recordings/
slurm-22.05-debian12/power-programs.log), with the recording's cluster name."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpuprov.errors import BadInput, GpuprovError
from gpuprov.slurm import elastic

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "roles" / "slurm" / "files" / "gpuprov-slurm-power"
RECORDED = (ROOT / "tests" / "fixtures" / "recordings" / "slurm-22.05-debian12" / "power-programs.log").read_text()


def test_the_recorded_hostlist_expands_to_the_two_dynamic_nodes() -> None:
    (hostlist,) = {line.split(" ", 2)[2] for line in RECORDED.splitlines()}
    assert hostlist == "try-dy-[1-2]"
    assert elastic.expand(hostlist, "try", 2) == ["try-dy-1", "try-dy-2"]


@pytest.mark.parametrize(("hostlist", "names"), [
    ("train-dy-3", ["train-dy-3"]),
    ("train-dy-[1-2,5]", ["train-dy-1", "train-dy-2", "train-dy-5"]),
    ("train-dy-[1-2],train-dy-4", ["train-dy-1", "train-dy-2", "train-dy-4"]),
    ("train-dy-[2,2]", ["train-dy-2"]),
])
def test_hostlists_of_this_clusters_dynamic_nodes(hostlist: str, names: list[str]) -> None:
    assert elastic.expand(hostlist, "train", 5) == names


@pytest.mark.parametrize(("hostlist", "words"), [
    ("train-dy-6", "not among train's 5 dynamic node(s)"),
    ("train-dy-[0-1]", "train-dy-0 not among"),
    ("train-1", "'train-1' is not a dynamic node of train"),  # a static node is never powered
    ("other-dy-1", "not a dynamic node of train"),
    ("train-dy-[1-2", "unbalanced brackets"),
    ("train-dy-[[1]]", "unbalanced brackets"),
    ("train-dy-[a-b]", "is not a number or a range"),
    ("train-dy-[3-1]", "range '3-1'"),
    ("train-dy-[1-999999999]", "range"),
    ("train-dy-1;reboot", "not a dynamic node"),
    ("", "expected Slurm's node list"),
])
def test_a_hostlist_with_anything_else_is_refused_whole(hostlist: str, words: str) -> None:
    with pytest.raises(GpuprovError) as caught:
        elastic.expand(hostlist, "train", 5)
    assert words in str(caught.value)


@pytest.mark.parametrize(("elastic_", "scheduler", "can", "words"), [
    (elastic.Elastic(count=4, max_count=2), "slurm", True, "--max-count 2 is smaller than --count 4"),
    (elastic.Elastic(count=1, max_count=3, idle_minutes=0), "slurm", True, "--idle-minutes 0: from 1"),
    (elastic.Elastic(count=1, max_count=3), "none", True, "dynamic nodes are Slurm's"),
    (elastic.Elastic(count=1, max_count=3), "slurm", False, "--max-count with --provider static"),
])
def test_bad_elastic_requests_are_one_line(elastic_: elastic.Elastic, scheduler: str, can: bool, words: str) -> None:
    with pytest.raises(BadInput) as caught:
        elastic_.checked(scheduler, can, "static")
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_a_good_request_is_checked_and_counted() -> None:
    e = elastic.Elastic(count=1, max_count=3, idle_minutes=10).checked("slurm", True, "docker")
    assert e.dynamic == 2 and elastic.dynamic_names("train", e.dynamic) == ["train-dy-1", "train-dy-2"]


# -- requests ---------------------------------------------------------------------------------
KEY = b"k" * 32


def test_a_signed_request_verifies_once_and_a_changed_one_never() -> None:
    body = elastic.request_body("resume", "train-dy-[1-2]", at=1000.0)
    sig = elastic.sign(KEY, body)
    seen = elastic.Seen()
    got = elastic.verify(KEY, body, sig, "train", 2, now=1001.0, seen=seen)
    assert (got.action, got.nodes) == ("resume", ("train-dy-1", "train-dy-2"))
    with pytest.raises(GpuprovError, match="already taken"):
        elastic.verify(KEY, body, sig, "train", 2, now=1002.0, seen=seen)
    tampered = body.replace(b"resume", b"suspend")
    with pytest.raises(GpuprovError, match="bad signature"):
        elastic.verify(KEY, tampered, sig, "train", 2, now=1001.0)
    with pytest.raises(GpuprovError, match="bad signature"):
        elastic.verify(b"x" * 32, body, sig, "train", 2, now=1001.0)
    with pytest.raises(GpuprovError, match="more than 120 s"):
        elastic.verify(KEY, body, sig, "train", 2, now=1000.0 + 121)


@pytest.mark.parametrize(("body", "words"), [
    (b"not json", "not JSON"),
    (json.dumps({"action": "resume", "hostlist": "train-dy-1"}).encode(), "exactly action, hostlist and at"),
    (json.dumps({"action": "reboot", "hostlist": "train-dy-1", "at": 1000}).encode(), "'reboot' is not one of"),
    (json.dumps({"action": "resume", "hostlist": "train-dy-1", "at": True}).encode(), "at is not a time"),
    (json.dumps({"action": "resume", "hostlist": "train-dy-9", "at": 1000}).encode(), "not among"),
])
def test_a_signed_request_that_says_something_else_is_refused(body: bytes, words: str) -> None:
    with pytest.raises(GpuprovError) as caught:
        elastic.verify(KEY, body, elastic.sign(KEY, body), "train", 2, now=1000.0)
    assert words in str(caught.value)


# -- the program as slurmctld runs it, against a real server on loopback -----------------------
TAKEN: list[elastic.PowerRequest] = []  # what the service took, in order (cleared per test)


class _Service(http.server.BaseHTTPRequestHandler):
    seen = elastic.Seen()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        try:
            got = elastic.verify(KEY, body, self.headers.get("X-Gpuprov-Signature", ""), "train", 2, seen=self.seen)
        except GpuprovError as exc:
            self.send_response(403)
            self.end_headers()
            self.wfile.write(str(exc).encode())
            return
        TAKEN.append(got)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def service():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    TAKEN.clear()
    yield server
    server.shutdown()


def _program(tmp_path: Path, name: str, url: str, key: bytes) -> list[str]:
    (tmp_path / "power.key").write_bytes(key)
    (tmp_path / "power.json").write_text(json.dumps({"url": url, "key_file": str(tmp_path / "power.key")}))
    link = tmp_path / name
    if not link.exists():
        shutil.copy(PROGRAM, link)
    return [sys.executable, "-I", "-S", str(link), "--config", str(tmp_path / "power.json")]


def test_the_program_sends_what_slurmctld_gave_it_and_the_service_takes_it(service, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{service.server_address[1]}/power"
    for name, action in (("gpuprov-slurm-resume", "resume"), ("gpuprov-slurm-suspend", "suspend"),
                         ("gpuprov-slurm-resume-failed", "fail")):
        proc = subprocess.run([*_program(tmp_path, name, url, KEY), "train-dy-[1-2]"], capture_output=True,
                              text=True, timeout=30, check=False, env={"PATH": os.environ["PATH"]})
        assert proc.returncode == 0, proc.stderr
        assert (TAKEN[-1].action, TAKEN[-1].nodes) == (action, ("train-dy-1", "train-dy-2"))


def test_the_program_says_why_in_one_line_when_refused(service, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{service.server_address[1]}/power"
    wrong = subprocess.run([*_program(tmp_path, "gpuprov-slurm-resume", url, b"w" * 32), "train-dy-1"],
                           capture_output=True, text=True, timeout=30, check=False)
    assert wrong.returncode == 1 and not TAKEN
    assert wrong.stderr.strip() == ("gpuprov power: resume train-dy-1: refused (403: power request: bad signature "
                                    "(not signed with this cluster's power key))")
    foreign = subprocess.run([*_program(tmp_path, "gpuprov-slurm-resume", url, KEY), "train-1"],
                             capture_output=True, text=True, timeout=30, check=False)
    assert foreign.returncode == 1 and "is not a dynamic node of train" in foreign.stderr
    down = subprocess.run([*_program(tmp_path, "gpuprov-slurm-suspend", "http://127.0.0.1:9/power", KEY),
                           "train-dy-1"], capture_output=True, text=True, timeout=30, check=False)
    assert down.returncode == 1 and down.stderr.startswith("gpuprov power: suspend train-dy-1: URLError")
    other = subprocess.run([*_program(tmp_path, "gpuprov-power-other", url, KEY), "train-dy-1"],
                           capture_output=True, text=True, timeout=30, check=False)
    assert other.returncode == 2 and "run as one of" in other.stderr


# -- what a dynamic node is given -------------------------------------------------------------
def test_a_dynamic_node_gets_the_controller_its_health_first_and_on_a_container_a_boot_of_its_own() -> None:
    files = {path: (data.decode(), mode) for path, data, mode in elastic.node_files("172.17.0.2", container=True)}
    # -b: slurmd reports a boot when it starts (Slurm's flag), where a container has the host's uptime.
    assert files[elastic.SLURMD_DEFAULTS] == ("SLURMD_OPTIONS=--conf-server 172.17.0.2 -b\n", 0o644)
    unit, mode = files[elastic.SLURMD_DROP_IN]
    assert mode == 0o644 and "[Unit]\nConditionPathExists=\n" in unit
    assert ("[Service]\nExecStartPre=/usr/bin/python3 -I -S /usr/local/lib/gpuprov/node-health.pyz --expect "
            "/etc/slurm/gpuprov-health-expect.json\n") in unit
    assert "ExecStart=" not in unit.replace("ExecStartPre=", "")  # Debian's own slurmd command line
    machine = dict((p, d.decode()) for p, d, _ in elastic.node_files("fd00::5", container=False))
    assert machine[elastic.SLURMD_DEFAULTS] == "SLURMD_OPTIONS=--conf-server [fd00::5]\n"  # an instance boots for real
    assert "ExecStartPre=/usr/bin/python3 -I -S" in machine[elastic.SLURMD_DROP_IN]


@pytest.mark.parametrize("addr", ["ctl", "10.0.0.5\nSLURMD_OPTIONS=-Z", "", "10.0.0.5 --foo"])
def test_only_an_ip_address_reaches_the_nodes_file(addr: str) -> None:
    with pytest.raises(GpuprovError, match="expected an IP address"):
        elastic.node_files(addr, container=True)
