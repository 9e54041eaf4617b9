"""A local node's lock (source distro) has no NCCL: the role builds and installs nothing."""


def test_nothing_is_built_without_nccl(host):
    assert not host.file("/opt/nccl-tests").exists
    assert not host.package("openmpi-bin").is_installed
