"""The slurm role's boot program (roles/slurm/files/gpuprov-slurm-hosts): a container engine
writes a local node's /etc/hosts anew at each start, dropping the role's block of Slurm names;
the program puts the role's kept copy back between the same markers blockinfile writes, changes
nothing where the block is there already, and replaces a stale one. Run here on files of a
temporary directory (its two arguments); on a node its unit runs it before slurmd, and
tests/e2e/test_slurm_e2e.py reboots a controller and resolves the other node's name after."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import ROOT

PROGRAM = ROOT / "roles" / "slurm" / "files" / "gpuprov-slurm-hosts"
BEGIN, END = "# BEGIN gpuprov slurm role: the Slurm nodes", "# END gpuprov slurm role: the Slurm nodes"
DOCKERS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n172.17.0.2\tc0ffee\n"
BLOCK = "172.17.0.2 demo-node-1\n172.17.0.3 demo-node-2\n"


def run(tmp_path: Path, hosts: str) -> tuple[str, str]:
    (tmp_path / "block").write_text(BLOCK)
    (tmp_path / "hosts").write_text(hosts)
    proc = subprocess.run(["sh", str(PROGRAM), str(tmp_path / "block"), str(tmp_path / "hosts")],
                          capture_output=True, text=True, check=True)
    return (tmp_path / "hosts").read_text(), proc.stdout


def test_a_fresh_hosts_file_gets_the_block_back_after_what_docker_wrote(tmp_path: Path) -> None:
    hosts, said = run(tmp_path, DOCKERS)
    assert hosts == f"{DOCKERS}{BEGIN}\n{BLOCK}{END}\n"
    assert "put back" in said


def test_the_block_already_there_changes_nothing(tmp_path: Path) -> None:
    hosts, said = run(tmp_path, f"{DOCKERS}{BEGIN}\n{BLOCK}{END}\n")
    assert hosts == f"{DOCKERS}{BEGIN}\n{BLOCK}{END}\n" and said == ""


def test_a_stale_block_is_replaced_and_the_rest_kept(tmp_path: Path) -> None:
    stale = f"{DOCKERS}{BEGIN}\n10.0.0.9 demo-node-1\n{END}\n192.0.2.7 added-by-hand\n"
    hosts, _ = run(tmp_path, stale)
    assert hosts == f"{DOCKERS}192.0.2.7 added-by-hand\n{BEGIN}\n{BLOCK}{END}\n"


def test_no_kept_block_leaves_the_file_alone(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text(DOCKERS)
    subprocess.run(["sh", str(PROGRAM), str(tmp_path / "absent"), str(tmp_path / "hosts")], check=True)
    assert (tmp_path / "hosts").read_text() == DOCKERS
