"""What the NVIDIA driver's apt pin costs every apt command on a node (figures, not a test).

apt reads /etc/apt/preferences.d/ each time it builds its policy (every apt-get, an apt-mark
that changes a mark, apt-cache policy, every Ansible apt task through python-apt) and matches
each name pattern of each record against every package name it knows. This boots a local node
(the node image, its package lists through this machine's package cache: `eval "$(scripts/env.sh)"`
first), writes the pin with the role's own template and filters (distro source, the default
lock's driver), and measures the CPU of opening apt's cache the way Ansible's apt module does
(`python3 -c 'import apt; apt.Cache()'`), median of --runs, with:

- the role's pin (its name patterns as globs, since 2026-11-28);
- the same pin with the patterns as regular expressions (the role's form before);
- no pin at all.

    python benchmarks/apt_policy.py [--runs 5] [--image gpuprov/node:bookworm]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROLE = ROOT / "roles" / "nvidia_driver"
PIN = "/etc/apt/preferences.d/gpuprov-nvidia-driver.pref"
REGEXES = "/nvidia/ /^libcuda/ /^libnvcuvid/ /^libnvoptix/"
OPEN = "import apt, time; t = time.process_time(); apt.Cache(); print(time.process_time() - t)"
# The role's template, filters and variables, as a play writes them (facts gathered: the distro
# source pins Debian's archive by the node's distribution).
PLAY = """
- name: The driver's apt pin, as the role writes it
  hosts: all
  gather_facts: true
  vars_files: [{vars}]
  tasks:
    - name: Write the pin
      ansible.builtin.template:
        src: {template}
        dest: {pin}
        mode: "0644"
"""


def node(container: str, *argv: str, stdin: str | None = None) -> str:
    return subprocess.run(["docker", "exec", "-i", container, *argv], input=stdin, capture_output=True,
                          text=True, check=True).stdout


def cpu(container: str, runs: int) -> float:
    return statistics.median(float(node(container, "python3", "-c", OPEN)) for _ in range(runs))


def write_pin(container: str) -> None:
    from gpuprov.lock import stack

    lock = stack.resolve("docker-node", source="distro")
    with tempfile.TemporaryDirectory() as tmp:
        play = Path(tmp) / "pin.yml"
        play.write_text(PLAY.format(vars=ROLE / "vars" / "main.yml", template=ROLE / "templates" /
                                    "gpuprov-nvidia-driver.pref.j2", pin=PIN))
        extra = Path(tmp) / "extra.json"
        extra.write_text(json.dumps({"nvidia_driver_source": "distro",
                                     "nvidia_driver_package_version": lock.as_dict()["packages"]["driver_version"]}))
        env = {**os.environ, "ANSIBLE_FILTER_PLUGINS": str(ROLE / "filter_plugins"), "ANSIBLE_NOCOLOR": "1"}
        subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", f"{container},", "-c",
                        "community.docker.docker", "-e", f"@{extra}", str(play)],
                       env=env, capture_output=True, text=True, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--image", default="gpuprov/node:bookworm")
    args = parser.parse_args(argv)
    proxy = os.environ.get("GPUPROV_APT_PROXY", "")
    if not proxy:
        print('GPUPROV_APT_PROXY is not set: eval "$(scripts/env.sh)" first', file=sys.stderr)
        return 2
    container = f"gpuprov-bench-apt-{secrets.token_hex(3)}"
    subprocess.run(["docker", "run", "-d", "--name", container, "--cgroupns", "host", "--cap-add", "SYS_ADMIN",
                    "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run", "--tmpfs", "/run/lock",
                    args.image, "/sbin/init"], capture_output=True, check=True)
    try:
        node(container, "tee", "/etc/apt/apt.conf.d/01gpuprov-proxy", stdin=f'Acquire::http::Proxy "{proxy}";\n')
        node(container, "apt-get", "update", "-q")
        names = len(node(container, "apt-cache", "pkgnames").split())
        write_pin(container)
        pin = node(container, "cat", PIN)
        rows = [("the role's pin (globs)", cpu(container, args.runs))]
        globs = next(line for line in pin.splitlines() if line.startswith("Package: "))
        node(container, "tee", PIN, stdin=pin.replace(globs, f"Package: {REGEXES}"))
        rows.append(("the same pin, regular expressions", cpu(container, args.runs)))
        node(container, "rm", PIN)
        rows.append(("no pin", cpu(container, args.runs)))
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)
    print(f"apt's cache opened on a {args.image} node ({names} package names; the pin's {globs!r}),")
    print(f"CPU-seconds, median of {args.runs}:")
    for label, seconds in rows:
        print(f"  {label:<36} {seconds:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
