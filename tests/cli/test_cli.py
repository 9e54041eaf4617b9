"""The command line: help, bad input (one line, exit 2, nothing created), JSON shapes."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprov.cli.app import main
from gpuprov.state import Store

COMMANDS = ["up", "down", "list", "status", "provision", "verify", "exec", "inventory", "types", "ssh", "ssh-config"]


def invoke(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(capsys, command: str) -> None:
    code, out, _ = invoke(capsys, command, "--help")
    assert code == 0
    assert out.startswith(f"Usage: gpuprov {command}")
    assert len(out.splitlines()) > 3


def _assert_bad_input(code: int, out: str, err: str, needle: str) -> None:
    assert code == 2, (code, out, err)
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gpuprov: ") and needle in lines[0], lines[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["up", "--provider", "docker", "--count", "0"], "0 is not in the range"),
        (["up", "--provider", "docker", "--count", "-3"], "-3 is not in the range"),
        (["up", "--provider", "nimbus", "--count", "1"], "'nimbus' is not one of"),
        (["up", "--type", "p4d.24xl", "--count", "1"], "did you mean p4d.24xlarge"),
        (["up", "--count", "1"], "--type is required for the aws provider"),
        (["up", "--provider", "docker"], "--count is required"),
        # Finding 12: a limit is checked before anything is made (was: host keys generated forever).
        (["up", "--provider", "docker", "--count", "1000000000"], "1000000000 is not in the range 1<=x<=256"),
        (["up", "--provider", "docker", "--count", "17"], "at most 16 local nodes"),
        (["up", "--provider", "docker", "--count", "1", "--name", "Bad_Name"], "invalid cluster name"),
        (["up", "--provider", "docker", "--count", "1", "--type", "p4d.24xlarge"],
         "only the 'docker-node' type"),
        (["up", "--provider", "static"], "needs --hosts"),
        (["up", "--provider", "static", "--hosts", "/nonexistent/hosts.yml"], "not found"),
        (["verify", "nosuch"], "unknown cluster 'nosuch'"),
        (["provision", "nosuch"], "unknown cluster 'nosuch'"),
        (["provision", "nosuch", "--via", "pull", "--check"], "--via pull cannot go with --check"),
        (["provision", "nosuch", "--via", "pull", "--scheduler", "slurm"], "--via pull cannot go with --scheduler"),
        (["provision", "nosuch", "--via", "ssh"], "--via"),
        (["status", "nosuch"], "unknown cluster 'nosuch'"),
        (["types", "--gpu", "Z9000"], "no instance type with GPU 'Z9000'"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_creates_nothing(capsys, gpuprov_home: Path, args, needle):
    code, out, err = invoke(capsys, *args)
    _assert_bad_input(code, out, err, needle)
    assert Store().list_clusters() == []
    assert not (gpuprov_home / "clusters").exists() or not any((gpuprov_home / "clusters").iterdir())


def test_down_unknown_cluster(capsys, gpuprov_home: Path, monkeypatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    code, out, err = invoke(capsys, "down", "nosuch", "--yes")
    _assert_bad_input(code, out, err, "unknown cluster 'nosuch'")


def test_malformed_hosts_file(capsys, gpuprov_home: Path, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.yml"
    hosts.write_text("hosts:\n  - name: a\n    user: [unclosed\n")
    code, out, err = invoke(capsys, "up", "--provider", "static", "--hosts", str(hosts))
    _assert_bad_input(code, out, err, "malformed")
    assert Store().list_clusters() == []


def test_no_docker_engine_says_how_to_start_one(capsys, gpuprov_home: Path, monkeypatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    code, out, err = invoke(capsys, "up", "--provider", "docker", "--count", "1", "--name", "x1")
    _assert_bad_input(code, out, err, "no Docker engine reachable")
    assert "systemctl start docker" in err
    assert Store().list_clusters() == []


def test_name_in_use_by_another_provider(capsys, gpuprov_home: Path, tmp_path: Path) -> None:
    Store().create_cluster("rack3", "static", {})
    code, out, err = invoke(capsys, "up", "--provider", "docker", "--count", "1", "--name", "rack3")
    _assert_bad_input(code, out, err, "already used by a static cluster")
    (cluster,) = Store().list_clusters()
    assert cluster.provider == "static" and cluster.nodes == ()


def test_operational_error_is_one_line_exit_1(capsys, gpuprov_home: Path, tmp_path: Path) -> None:
    # A host that does not answer: valid input, failed operation.
    key = tmp_path / "key"
    key.write_text("x")
    hosts = tmp_path / "hosts.yml"
    hosts.write_text(f"hosts:\n  - name: gone\n    address: 127.0.0.1\n    port: 1\n"
                     f"    user: root\n    key: {key}\n    host_key: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGr\n")
    code, _, err = invoke(capsys, "up", "--provider", "static", "--hosts", str(hosts),
                          "--name", "gone")
    assert code == 1, err
    errors = [line for line in err.splitlines() if line.startswith("gpuprov:")]
    assert len(errors) == 1 and "SSH not reachable" in errors[0], err
    assert "Traceback" not in err
    assert Store().list_clusters() == []


def test_types_json_and_list_json(capsys, gpuprov_home: Path) -> None:
    code, out, _ = invoke(capsys, "types", "--gpu", "A100", "-o", "json")
    assert code == 0
    rows = json.loads(out)
    assert {r["instance_type"] for r in rows} == {"p4d.24xlarge", "p4de.24xlarge", "dgx-a100",
                                                  "hgx-a100-8gpu"}
    assert all(r["gpus"] == 8 and r["nvswitch"] for r in rows)
    onprem = {r["instance_type"]: r for r in rows if r["provider"] == "onprem"}
    assert all(not r["efa"] for r in onprem.values()) and set(onprem) == {"dgx-a100", "hgx-a100-8gpu"}
    code, out, _ = invoke(capsys, "list", "-o", "json")
    assert code == 0 and json.loads(out) == []


def test_dry_run_creates_nothing(capsys, gpuprov_home: Path, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.yml"
    hosts.write_text("hosts:\n  - name: gpu01\n    address: 192.0.2.1\n    user: ubuntu\n")
    code, out, err = invoke(capsys, "up", "--provider", "static", "--hosts", str(hosts),
                            "--name", "plan-only", "--dry-run", "-o", "json")
    assert code == 0, err
    data = json.loads(out)
    cost = data.pop("cost")
    assert data == {"cluster": "plan-only", "provider": "static", "nodes": [], "bootstrap": None, "dry_run": True}
    # Existing hosts: no price, and why (the plan's cost line as data).
    assert cost["nodes"] == 1 and cost["usd_per_hour"] is None and "knows no price" in cost["why"], cost
    assert "1 existing host(s)" in err
    assert Store().list_clusters() == []
    assert not (gpuprov_home / "clusters" / "plan-only").exists()
    # As a table: the plan, and no empty node table after it; no state database either.
    code, out, err = invoke(capsys, "up", "--provider", "static", "--hosts", str(hosts), "--name", "plan-only",
                            "--dry-run")
    assert code == 0 and out == "" and "plan: plan-only (static): 1 x node" in err, out + err
    assert not any(p.is_file() for p in gpuprov_home.rglob("*")), sorted(gpuprov_home.rglob("*"))


def loaded_by_help(names: set[str]) -> list[str]:
    """Which of the modules ``names`` (or top-level packages) a fresh `gpuprov --help` loads."""
    code = (
        "import sys; from gpuprov.cli.app import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted({m for m in sys.modules} | {m.split('.')[0] for m in sys.modules}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return sorted(names & set(ast.literal_eval(proc.stdout.strip().splitlines()[-1])))


def test_cli_start_up_imports_no_heavy_library() -> None:
    """`gpuprov --help` must not import boto3, Ansible, testinfra, fabric or rich."""
    assert loaded_by_help({"boto3", "botocore", "ansible", "ansible_runner", "testinfra", "fabric", "paramiko",
                           "rich", "jinja2", "yaml", "pytest", "platformdirs"}) == []


def test_cli_start_up_reads_no_state_and_no_price_table() -> None:
    """`gpuprov --help` opens no database and loads no catalog or price table: the state (and
    sqlite3), the instance catalog and the pricing modules load with the commands that use them
    (their import was about 20 of the start-up's milliseconds on the 2-core test machine)."""
    assert loaded_by_help({"sqlite3", "gpuprov.state", "gpuprov.catalog", "gpuprov.pricing.select",
                           "gpuprov.pricing.prices"}) == []


def test_generated_name_is_printed(capsys, gpuprov_home: Path, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.ini"
    hosts.write_text("gpu01 ansible_host=192.0.2.1 ansible_user=ubuntu\n")
    code, out, err = invoke(capsys, "up", "--provider", "static", "--hosts", str(hosts),
                            "--dry-run", "-o", "json")
    assert code == 0, err
    name = json.loads(out)["cluster"]
    assert name.startswith("gpu-") and f"cluster name: {name}" in err


@pytest.mark.parametrize(
    ("flags", "rule"),
    [
        (["--driver", "515"], r"CUDA 11.8 needs driver >= 520.61.05"),
        (["--type", "p5.48xlarge", "--cuda", "11.7"], r"sm_90 needs CUDA >= 11.8"),
        (["--type", "p4d.24xlarge", "--source", "distro"], "needs fabric manager"),
    ],
)
def test_impossible_stack_is_refused_before_anything_is_created(
        capsys, gpuprov_home: Path, tmp_path: Path, flags, rule) -> None:
    hosts = tmp_path / "hosts.yml"
    hosts.write_text("hosts:\n  - name: gpu01\n    address: 192.0.2.1\n    user: ubuntu\n")
    code, out, err = invoke(capsys, "up", "--provider", "static", "--hosts", str(hosts),
                            "--name", "locked", *flags)
    assert code == 2 and out == ""
    assert re.search(rule, err.strip().splitlines()[-1]), err
    assert Store().list_clusters() == []


def test_mirror_source_needs_its_url_and_key(capsys, gpuprov_home: Path, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.yml"
    hosts.write_text("hosts:\n  - name: gpu01\n    address: 192.0.2.1\n    user: ubuntu\n")
    code, out, err = invoke(capsys, "up", "--provider", "static", "--hosts", str(hosts),
                            "--source", "mirror")
    _assert_bad_input(code, out, err, "--source mirror needs --mirror-url")


# -- trust review findings: each input is judged before anything is created ---------------------
def _hosts(tmp_path: Path) -> str:
    hosts = tmp_path / "hosts.yml"
    hosts.write_text("hosts:\n  - name: gpu01\n    address: 192.0.2.1\n    user: ubuntu\n")
    return str(hosts)


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        # Finding 4: `re.match` with `$` let a trailing newline through.
        (["--name", "ab\n"], "invalid cluster name 'ab\\n'"),
        # Finding 9: a newline in the URL would add lines (`Trusted: yes`) to a deb822 source.
        (["--source", "mirror", "--mirror-url", "http://m.example/nvidia\nTrusted: yes",
          "--mirror-key-fingerprint", "A" * 40], "a URL has no spaces, tabs or newlines"),
        (["--source", "mirror", "--mirror-url", "http://m.example/ nvidia",
          "--mirror-key-fingerprint", "A" * 40], "a URL has no spaces"),
        (["--source", "mirror", "--mirror-url", "ftp://m.example/nvidia",
          "--mirror-key-fingerprint", "A" * 40], "expected http:// or https://"),
        (["--source", "mirror", "--mirror-url", "http://m.example/nvidia",
          "--mirror-key-fingerprint", "DEADBEEF"], "40 hex digits"),
        (["--source", "mirror", "--mirror-url", "http://m.example/nvidia",
          "--mirror-key-fingerprint", "Z" * 40], "40 hex digits"),
        # Finding 10: was "internal error".
        (["--driver", "abc"], "--driver 'abc': expected a branch"),
        (["--cuda", "eleven"], "--cuda 'eleven'"),
    ],
)
def test_untrusted_flags_are_bad_input(capsys, gpuprov_home: Path, tmp_path: Path, flags, needle) -> None:
    code, out, err = invoke(capsys, "up", "--provider", "static", "--hosts", _hosts(tmp_path), *flags)
    _assert_bad_input(code, out, err, needle)
    assert Store().list_clusters() == []
    assert not (gpuprov_home / "clusters").exists() or not any((gpuprov_home / "clusters").iterdir())


def test_unknown_tags_are_bad_input(capsys, gpuprov_home: Path) -> None:
    """Finding 5: `--tags "never --list-hosts"` was shell-split into a second option."""
    Store().create_cluster("c1", "static", {})
    for tags in ("never --list-hosts", "never", "driver,nope", ""):
        code, out, err = invoke(capsys, "provision", "c1", "--tags", tags)
        _assert_bad_input(code, out, err, "--tags")
    assert Store().get_cluster("c1").state == "launching"


def test_tags_reach_ansible_as_one_argument_each() -> None:
    import shlex

    from gpuprov.ansible.runner import known_tags, parse_tags

    assert {"preflight", "driver", "cuda", "containers", "rdma", "microcode", "spot"} <= known_tags()
    assert "never" not in known_tags() and "always" not in known_tags()
    assert parse_tags("driver, cuda") == ["driver", "cuda"]
    args = ["--tags", "driver,cuda", "--limit", "a,b"]
    assert shlex.split(shlex.join(args)) == args


def test_corrupt_state_db_is_one_line_exit_2(capsys, gpuprov_home: Path) -> None:
    gpuprov_home.mkdir(parents=True)
    (gpuprov_home / "state.db").write_bytes(b"this is not a database" * 100)
    code, out, err = invoke(capsys, "list")
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert f"state database {gpuprov_home / 'state.db'} is damaged (file is not a database)" in line
    assert "restore it from a backup, or move it aside" in line


def test_unwritable_state_dir_is_one_line_exit_1(capsys, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GPUPROV_HOME", str(tmp_path / "file" / "home"))
    (tmp_path / "file").write_text("a file where a directory should be")
    code, out, err = invoke(capsys, "list")
    assert code == 1 and out == ""
    (line,) = err.strip().splitlines()
    assert f"state directory {tmp_path / 'file' / 'home'} cannot be created" in line


def test_wide_ssh_flag_is_for_aws_only(capsys, gpuprov_home: Path) -> None:
    code, out, err = invoke(capsys, "up", "--provider", "docker", "--count", "1", "--allow-wide-ssh-cidr")
    _assert_bad_input(code, out, err, "--allow-wide-ssh-cidr is for --provider aws")


def test_stack_help_says_what_debian_13_is_proven_for_as_the_readme_does(capsys) -> None:
    """Issue 53, section 7: `stack --help` said Debian 13 was proven for three plays and three
    roles while `stack`'s output and the README say the whole site (`make test-debian13`)."""
    code, out, _ = invoke(capsys, "stack", "--help")
    text = " ".join(out.split())
    assert code == 0 and "three roles" not in text
    assert "Debian 13 with --source distro: the whole site on a local node" in text
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    assert "installs the whole site from trixie's own archive" in readme


def test_debug_is_taken_after_the_command_too_never_after_a_double_dash() -> None:
    """Issue 53, section 7: `gpuprov verify demo --debug` was refused (no such option)."""
    from gpuprov.cli.options import debug_anywhere

    assert debug_anywhere(["verify", "demo", "--debug"]) == (["--debug", "verify", "demo"], True)
    assert debug_anywhere(["--debug", "list"]) == (["--debug", "list"], True)
    assert debug_anywhere(["exec", "demo", "--", "prog", "--debug"]) == (["exec", "demo", "--", "prog", "--debug"], False)
    assert debug_anywhere(["list"]) == (["list"], False)


def test_debug_after_the_command_shows_the_traceback(capsys, gpuprov_home: Path) -> None:
    code, _, err = invoke(capsys, "status", "nosuch", "--debug")
    assert code == 2 and "Traceback" in err and "no such option" not in err.lower(), err
