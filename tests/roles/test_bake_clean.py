"""The bake's clean-up (gpuprov/data/bake-clean.sh), run for real as root in a throwaway
container of the local node image, on files planted where a used node keeps them."""

from __future__ import annotations

import subprocess

from gpuprov import images
from gpuprov.providers.docker import DEFAULT_IMAGE
from tests.conftest import require_docker

PLANTED = {
    "/etc/ssh/ssh_host_ed25519_key": "secret", "/etc/ssh/ssh_host_ed25519_key.pub": "pub",
    "/etc/ssh/gpuprov_host_ed25519_key": "secret", "/etc/machine-id": "0123456789abcdef",
    "/etc/gpuprov/hostkey-installed": "node", "/etc/ssh/sshd_config.d/10-gpuprov-hostkey.conf": "HostKey x",
    "/etc/ssh/sshd_config.d/10-gpuprov.conf": "HostKey /etc/ssh/ssh_host_ed25519_key",
    "/var/lib/dbus/machine-id": "x", "/home/gpuprov/.ssh/authorized_keys": "ssh-ed25519 AAAA",
    "/root/.ssh/authorized_keys": "k", "/root/.docker/config.json": '{"auths": {}}',
    "/root/.bash_history": "history", "/home/gpuprov/.ansible/tmp/x": "t",
    "/etc/apt/apt.conf.d/01gpuprov-proxy": "proxy", "/var/log/syslog": "log", "/var/log/syslog.1": "old",
    "/var/log/journal/abc/system.journal": "j", "/var/lib/apt/lists/deb_InRelease": "l",
    "/var/cache/apt/archives/x.deb": "d", "/var/lib/cloud/instances/i-1/user-data.txt": "u",
    "/tmp/leftover": "t", "/var/tmp/leftover": "t",
    "/etc/munge/munge.key": "munge", "/etc/slurm/gpuprov-power.key": "power",
    "/var/lib/slurm/slurmctld/job_state": "s", "/var/lib/slurm/slurmd/conf-cache/slurm.conf": "c",
    "/etc/apt/apt.conf.d/99keep": "keep", "/usr/local/bin/keep": "keep",
}
GONE = [p for p in PLANTED if p not in ("/etc/machine-id", "/var/log/syslog", "/etc/apt/apt.conf.d/99keep",
                                         "/usr/local/bin/keep", "/etc/ssh/sshd_config.d/10-gpuprov.conf")]


def test_the_clean_script_removes_what_a_new_node_must_not_inherit() -> None:
    require_docker()
    plant = "".join(f"mkdir -p \"$(dirname {p})\" && printf %s {text!r} > {p}\n" for p, text in PLANTED.items())
    check = "".join(f"[ -e {p} ] && echo LEFT {p}\n" for p in GONE) + (
        "echo machine-id=$(wc -c < /etc/machine-id) syslog=$(wc -c < /var/log/syslog)\n"
        "cat /etc/apt/apt.conf.d/99keep /usr/local/bin/keep; echo\n"
        "stat -c lists-mtime=%Y /var/lib/apt/lists\n"
        "[ -e /etc/ssh/sshd_config.d/10-gpuprov.conf ] && echo kept-image-sshd-config\n")
    script = f"set -e\n{plant}sh -s <<'CLEAN'\n{images.clean_script()}\nCLEAN\nset +e\n{check}"
    proc = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "/bin/sh",
                           DEFAULT_IMAGE, "-c", script], capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "clean: done" in out and "LEFT" not in out, out
    assert "machine-id=0 syslog=0" in out and "keepkeep" in out and "lists-mtime=0" in out, out
    assert "kept-image-sshd-config" in out, out  # the image's own sshd settings stay
