"""CLI start-up: commands that read no hosts file and run no play do not load ansible-core's
inventory code (about 0.2 s of imports: `gpuprov list` took 369 ms before, 165 ms after, median
of 11 runs on the quiet 2-core test machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """import json
import sys
from gpuprov.cli.app import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps({p: sorted(m for m in sys.modules if m.startswith(p)) for p in ("ansible.inventory", "gpuprov.core.")}))
"""


def _loaded(args: list[str], tmp_path: Path) -> dict[str, list[str]]:
    """The modules of ansible.inventory and of gpuprov.core that `gpuprov ARGS` loaded."""
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, check=False,
                          env={"GPUPROV_HOME": str(tmp_path / "home"), "GPUPROV_CONFIG": str(tmp_path / "none.toml"),
                               "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("args", [["list"], ["--help"], ["types"]])
def test_commands_that_read_no_hosts_file_do_not_load_ansibles_inventory(args: list[str], tmp_path: Path) -> None:
    assert _loaded(args, tmp_path)["ansible.inventory"] == []


@pytest.mark.parametrize(("args", "loaded"), [
    (["--help"], []),
    (["up", "--help"], []),
    (["patch", "--help"], []),
    # status imports monitoring, and elastic (a cluster's dynamic nodes)
    (["list"], ["gpuprov.core.elastic", "gpuprov.core.monitoring", "gpuprov.core.status"]),
])
def test_a_commands_module_loads_when_it_runs(args: list[str], loaded: list[str], tmp_path: Path) -> None:
    """The command registry (gpuprov/cli/registry.py): help and click's parsing load no module of
    gpuprov/core/; a command loads its own when it runs."""
    assert _loaded(args, tmp_path)["gpuprov.core."] == loaded


def test_reading_a_hosts_file_still_finds_the_parser(tmp_path: Path) -> None:
    from gpuprov.providers import static

    hosts = tmp_path / "hosts.yml"
    hosts.write_text("user: ops\nhosts:\n  - name: rack-1\n    address: 10.0.0.1\n")
    found, _ = static.parse_hosts_file(str(hosts))
    assert [h.name for h in found] == ["rack-1"] and isinstance(found[0], static.StaticHost)
