"""slurm.conf, gres.conf, cgroup.conf and the task environment (the slurm role's filter plugin,
through gpuprov.slurm.conf) on the recorded machines of tests/fixtures/recordings: the 1-GPU
H100 and H200 (their lscpu, free and PCI census), the 8-GPU p4d.24xlarge and p5.48xlarge (the
GPU model from the recorded PCI ids, the count and CPUs from the catalog, since the public
excerpts show part of the bus only), and a local node without GPU. Then the refusals: no value
can end a line, start a comment or add a parameter. And the munge key file."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from gpuprov import catalog, paths
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.sharing import choice, layouts
from gpuprov.slurm import conf, munge
from gpuprov.slurm.conf import SlurmCluster, SlurmNode

REC = Path(__file__).resolve().parents[1] / "fixtures" / "recordings"


def _lscpu(text: str) -> dict[str, int]:
    def field(name: str) -> int:
        return int(re.search(rf"^{re.escape(name)}:\s+(\d+)", text, re.M).group(1))

    return {"cpus": field("CPU(s)"), "sockets": field("Socket(s)"),
            "cores_per_socket": field("Core(s) per socket"), "threads_per_core": field("Thread(s) per core")}


def _census(folder: str) -> tuple[int, str]:
    bus = catalog.parse_pci((REC / folder / "pci.txt").read_text())
    models = {catalog.GPU_BY_PCI_DEVICE[d] for d in bus["gpu_device_ids"]}
    assert len(models) == 1
    return len(bus["gpu_device_ids"]), models.pop()


def h100(nvml: bool = False) -> SlurmNode:
    """The recorded H100 VM: lscpu (cpu.txt), `free -g` (os.txt: 125 GiB total), its PCI bus."""
    cpu = _lscpu((REC / "h100-sxm5-580" / "cpu.txt").read_text())
    total_gib = int(re.search(r"^Mem:\s+(\d+)", (REC / "h100-sxm5-580" / "os.txt").read_text(), re.M).group(1))
    gpus, model = _census("h100-sxm5-580")
    return SlurmNode(name="h100-1", addr="10.0.0.11", memtotal_mb=total_gib * 1024, gpus=gpus, gpu_model=model,
                     nvml=nvml, **cpu)


def h200(nvml: bool = False) -> SlurmNode:
    """The recorded H200 VM: 16 vCPUs (os.txt's nproc), its PCI bus; its memory is not recorded
    (FIXTURE: 125 GiB, the H100 VM's of the same lender)."""
    nproc = int(re.findall(r"^(\d+)$", (REC / "h200-580" / "os.txt").read_text(), re.M)[-1])
    gpus, model = _census("h200-580")
    return SlurmNode(name="h200-1", cpus=nproc, sockets=1, cores_per_socket=nproc, threads_per_core=1,
                     memtotal_mb=125 * 1024, gpus=gpus, gpu_model=model, nvml=nvml)


def eight_gpu(itype: str, folder: str, name: str, sockets: int, threads: int) -> SlurmNode:
    """An 8-GPU EC2 node: the GPU model its recorded PCI ids name (p4d: lspci excerpt) or, for
    p5 (no PCI recording), the catalog's; count, vCPUs and memory from the catalog; sockets and
    threads per core as EC2 describes the type (2 sockets, 2 threads per core)."""
    t = catalog.get(itype)
    model = t.gpu_model
    if folder:
        # Plain lspci names an unnamed NVIDIA function by its device id ("Device 20b0").
        ids = re.findall(r"controller: NVIDIA Corporation Device ([0-9a-f]{4})", (REC / folder / "lspci.txt").read_text())
        assert ids and {catalog.GPU_BY_PCI_DEVICE[f"0x{d}"] for d in ids} == {model}
    return SlurmNode(name=name, cpus=t.vcpus, sockets=sockets, cores_per_socket=t.vcpus // sockets // threads,
                     threads_per_core=threads, memtotal_mb=t.memory_gib * 1024, gpus=t.gpu_count,
                     gpu_model=model, partition=itype)


def p4d(name: str = "p4d-1") -> SlurmNode:
    return eight_gpu("p4d.24xlarge", "p4d-24xlarge", name, 2, 2)


def p5(name: str = "p5-1") -> SlurmNode:
    return eight_gpu("p5.48xlarge", "", name, 2, 2)


def local() -> SlurmNode:
    """A local container node: 2 cores, 24 GiB (this project's test machine), no GPU."""
    return SlurmNode(name="demo-1", addr="172.17.0.3", cpus=2, sockets=1, cores_per_socket=2, threads_per_core=1,
                     memtotal_mb=24 * 1024)


def cluster(*nodes: SlurmNode, **kw) -> SlurmCluster:
    return SlurmCluster(cluster_name=kw.pop("cluster_name", "train"), controller=nodes[0].name,
                        controller_addr=kw.pop("controller_addr", ""), nodes=tuple(nodes), **kw)


def node_line(text: str, name: str) -> str:
    (line,) = [ln for ln in text.splitlines() if ln.startswith(f"NodeName={name} ")]
    return line


# -- the node lines -------------------------------------------------------------------------

def test_the_recorded_h100_is_one_h100_with_its_cpus_and_memory_less_the_reserve() -> None:
    node = h100()
    assert (node.cpus, node.sockets, node.cores_per_socket, node.threads_per_core) == (16, 1, 16, 1)
    assert (node.gpus, node.gpu_model) == (1, "H100")
    # 125 GiB = 128000 MiB; the OS keeps 5 % (6400), the driver 512 per GPU.
    assert conf.real_memory(128000, 1) == 128000 - 6400 - 512
    assert node_line(conf.slurm_conf(cluster(node)), "h100-1") == (
        "NodeName=h100-1 NodeAddr=10.0.0.11 CPUs=16 Sockets=1 CoresPerSocket=16 ThreadsPerCore=1 "
        "RealMemory=121088 Gres=gpu:h100:1 State=UNKNOWN")


def test_the_recorded_h200_is_typed_h200_though_debians_pci_ids_lags() -> None:
    line = node_line(conf.slurm_conf(cluster(h200())), "h200-1")
    assert "CPUs=16 Sockets=1 CoresPerSocket=16 ThreadsPerCore=1" in line
    assert line.endswith(" Gres=gpu:h200:1 State=UNKNOWN")


@pytest.mark.parametrize(("make", "gres", "cpus"), [
    (p4d, "gpu:a100:8", "CPUs=96 Sockets=2 CoresPerSocket=24 ThreadsPerCore=2"),
    (p5, "gpu:h100:8", "CPUs=192 Sockets=2 CoresPerSocket=48 ThreadsPerCore=2"),
])
def test_eight_gpu_nodes_get_eight_typed_gpus_and_the_driver_reserve(make, gres: str, cpus: str) -> None:
    node = make()
    line = node_line(conf.slurm_conf(cluster(node)), node.name)
    assert cpus in line and f" Gres={gres} " in line
    memory = node.memtotal_mb
    assert f" RealMemory={memory - memory * 5 // 100 - 8 * 512} " in line


def test_a_node_without_gpus_gets_no_gres_and_the_os_floor_on_a_small_node() -> None:
    line = node_line(conf.slurm_conf(cluster(local())), "demo-1")
    assert "Gres" not in line
    assert " RealMemory=23348 " in line  # 24576 - 5 % (1228)
    assert conf.real_memory(2048) == 1024  # 5 % is under the 1 GiB floor: the floor
    assert conf.real_memory(512) == 1  # never zero or negative


def test_the_cluster_wide_settings_are_the_issues() -> None:
    text = conf.slurm_conf(cluster(local(), controller_addr="172.17.0.3"))
    for line in ("ClusterName=train", "SlurmctldHost=demo-1(172.17.0.3)", "GresTypes=gpu",
                 "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core_Memory",
                 "ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup,task/affinity",
                 "AuthType=auth/munge", "MpiDefault=pmix"):
        assert line in text.splitlines()
    assert "TaskProlog" not in text and "HealthCheck" not in text
    assert conf.cgroup_conf().splitlines()[1:] == ["ConstrainCores=yes", "ConstrainDevices=yes",
                                                   "ConstrainRAMSpace=yes"]


def test_task_prolog_and_health_check_lines_when_asked() -> None:
    text = conf.slurm_conf(cluster(local(), task_prolog="/etc/slurm/gpuprov-task-prolog",
                                   health_check_program="/usr/local/sbin/gpuprov-health", health_check_interval=120))
    lines = text.splitlines()
    assert "TaskProlog=/etc/slurm/gpuprov-task-prolog" in lines
    assert {"HealthCheckProgram=/usr/local/sbin/gpuprov-health", "HealthCheckInterval=120",
            "HealthCheckNodeState=ANY"} <= set(lines)


def test_one_partition_per_instance_type_and_a_default_one_of_all() -> None:
    text = conf.slurm_conf(cluster(p4d("p4d-1"), p4d("p4d-2"), p5("p5-1"), local()))
    parts = [ln for ln in text.splitlines() if ln.startswith("PartitionName=")]
    assert [p.split()[0:3] for p in parts] == [
        ["PartitionName=all", "Nodes=p4d-1,p4d-2,p5-1,demo-1", "Default=YES"],
        ["PartitionName=cpu", "Nodes=demo-1", "Default=NO"],
        ["PartitionName=p4d.24xlarge", "Nodes=p4d-1,p4d-2", "Default=NO"],
        ["PartitionName=p5.48xlarge", "Nodes=p5-1", "Default=NO"],
    ]
    # The default memory per CPU is the smallest share a node of the partition has.
    p5_share = conf.real_memory(2048 * 1024, 8) // 192  # 10355 MiB, under the local node's 11674
    assert p5_share < conf.real_memory(24 * 1024) // 2
    assert parts[0].endswith(f"DefMemPerCPU={p5_share}")
    assert parts[2].endswith(f"DefMemPerCPU={conf.real_memory(1152 * 1024, 8) // 96}")


# -- gres.conf ------------------------------------------------------------------------------

def test_gres_conf_autodetects_with_nvml_and_lists_device_files_without() -> None:
    assert conf.gres_conf(cluster(h100(nvml=True))).splitlines()[1:] == ["NodeName=h100-1 AutoDetect=nvml"]
    assert conf.gres_conf(cluster(h100(nvml=False))).splitlines()[1:] == [
        "NodeName=h100-1 AutoDetect=off Name=gpu Type=h100 File=/dev/nvidia0"]
    assert conf.gres_conf(cluster(h200())).splitlines()[1:] == [
        "NodeName=h200-1 AutoDetect=off Name=gpu Type=h200 File=/dev/nvidia0"]
    text = conf.gres_conf(cluster(p4d(), p5(), local()))
    assert text.splitlines()[1:] == [
        "NodeName=p4d-1 AutoDetect=off Name=gpu Type=a100 File=/dev/nvidia[0-7]",
        "NodeName=p5-1 AutoDetect=off Name=gpu Type=h100 File=/dev/nvidia[0-7]",
    ]


def test_nvml_without_gpus_means_nothing_and_an_unknown_model_is_untyped() -> None:
    bare = SlurmNode(name="gpu-1", cpus=8, sockets=1, cores_per_socket=8, threads_per_core=1, memtotal_mb=65536,
                     gpus=2, gpu_model="")
    assert " Gres=gpu:2 " in node_line(conf.slurm_conf(cluster(bare)), "gpu-1")
    assert conf.gres_conf(cluster(bare)).splitlines()[1:] == ["NodeName=gpu-1 AutoDetect=off Name=gpu File=/dev/nvidia[0-1]"]
    cpu_only = SlurmNode(**{**vars(local()), "nvml": True})
    assert conf.gres_conf(cluster(cpu_only)).splitlines()[1:] == []


# -- Ansible facts to a node ----------------------------------------------------------------

def test_a_node_from_ansible_facts() -> None:
    rules = conf.rules()
    facts = {"hostname": "demo-1", "processor_vcpus": 4, "processor_count": 1, "processor_cores": 2,
             "processor_threads_per_core": 2, "memtotal_mb": 7976, "default_ipv4": {"address": "172.17.0.4"}}
    node = rules.node_from_facts(facts, 0, "", True, "")
    assert node == {"name": "demo-1", "addr": "172.17.0.4", "cpus": 4, "sockets": 1, "cores_per_socket": 2,
                    "threads_per_core": 2, "memtotal_mb": 7976, "gpus": 0, "gpu_model": "", "nvml": False,
                    "partition": ""}
    # A hypervisor's topology that does not multiply to the CPU count: one socket, never more.
    odd = rules.node_from_facts({**facts, "processor_count": 2, "processor_cores": 4}, 1, "H100", True, "x")
    assert (odd["sockets"], odd["cores_per_socket"], odd["threads_per_core"], odd["nvml"]) == (1, 2, 2, True)


def test_the_role_and_gpuprov_use_one_copy_of_the_rules() -> None:
    plugin = paths.roles_dir() / "slurm" / "filter_plugins" / "gpuprov_slurm.py"
    assert Path(conf.rules().__file__).resolve() == plugin.resolve()
    filters = conf.rules().FilterModule().filters()
    assert filters["slurm_conf"] is conf.rules().slurm_conf and filters["slurm_gres_conf"] is conf.rules().gres_conf


# -- the task environment --------------------------------------------------------------------

def test_task_env_lines_are_sorted_exports_taken_literally() -> None:
    env = {"NCCL_SOCKET_IFNAME": "^lo,docker", "FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": 1,
           "NCCL_NET_PLUGIN": "/opt/aws ofi/lib"}
    assert conf.task_env(env) == ("export FI_EFA_USE_DEVICE_RDMA=1\nexport FI_PROVIDER=efa\n"
                                  "export NCCL_NET_PLUGIN=/opt/aws ofi/lib\nexport NCCL_SOCKET_IFNAME=^lo,docker\n")
    assert conf.task_env({}) == ""


# -- refusals: nothing reaches a line that could add one --------------------------------------

INJECTIONS = ["a\nb", "a b", "a=b", "a#b", "a,b", "n[1-2]", "", "-a", "x" * 64, "a\rb", "a\tb"]


@pytest.mark.parametrize("bad", INJECTIONS)
def test_a_node_name_that_is_no_host_name_is_refused(bad: str) -> None:
    with pytest.raises(BadInput, match="node name"):
        conf.slurm_conf(cluster(SlurmNode(**{**vars(local()), "name": bad})))


@pytest.mark.parametrize(("field", "bad", "named"), [
    ("partition", "p4d\nPartitionName=evil Nodes=ALL", "partition"),
    ("partition", "p4d State=DOWN", "partition"),
    ("gpu_model", "H100\nNodeName=evil", "gpu_model"),
    ("gpu_model", "H100 Gres=gpu:99", "gpu_model"),
    ("addr", "10.0.0.1 CPUs=9999", "addr"),
    ("addr", "host#x", "addr"),
    ("memtotal_mb", "1000\nx", "memtotal_mb"),
    ("cpus", True, "cpus"),
    ("gpus", -1, "gpus"),
])
def test_a_node_value_that_could_add_a_parameter_is_refused(field: str, bad, named: str) -> None:
    node = SlurmNode(**{**vars(h100()), field: bad})
    with pytest.raises(BadInput, match=named):
        conf.slurm_conf(cluster(node))


@pytest.mark.parametrize(("kw", "named"), [
    ({"cluster_name": "train\nSlurmUser=root"}, "cluster_name"),
    ({"cluster_name": "two words"}, "cluster_name"),
    ({"controller_addr": "10.0.0.1)\nSlurmctldHost=evil("}, "controller_addr"),
    ({"default_partition": "all Default=NO"}, "default_partition"),
    ({"default_partition": "cpu"}, "default partition"),
    ({"health_check_program": "/bin/sh -c reboot"}, "health_check_program"),
    ({"health_check_program": "relative/path"}, "health_check_program"),
    ({"task_prolog": "/tmp/x;rm"}, "task_prolog"),
    ({"health_check_interval": 0}, "health_check_interval"),
])
def test_a_cluster_value_that_could_add_a_line_is_refused(kw: dict, named: str) -> None:
    with pytest.raises(BadInput, match=named):
        conf.slurm_conf(cluster(local(), **kw))


def test_a_controller_name_with_a_newline_and_doubled_or_missing_nodes_are_refused() -> None:
    with pytest.raises(BadInput, match="controller"):
        conf.slurm_conf(SlurmCluster(cluster_name="c", controller="ctl\nx", nodes=(local(),)))
    with pytest.raises(BadInput, match="listed twice"):
        conf.slurm_conf(cluster(local(), local()))
    with pytest.raises(BadInput, match="no compute node"):
        conf.slurm_conf(SlurmCluster(cluster_name="c", controller="ctl", nodes=()))
    with pytest.raises(BadInput, match="is not cpus"):
        conf.slurm_conf(cluster(SlurmNode(**{**vars(local()), "cpus": 3})))


@pytest.mark.parametrize(("env", "named"), [
    ({"A": "1\nexport LD_PRELOAD=/tmp/x.so"}, "control character"),
    ({"A": "x\r"}, "control character"),
    ({"A B": "1"}, "name"),
    ({"A=B": "1"}, "name"),
    ({"1A": "1"}, "name"),
    ({"A": ["list"]}, "string or number"),
    ({"A": True}, "string or number"),
    (["A=1"], "mapping"),
])
def test_a_task_environment_that_could_add_a_line_is_refused(env, named: str) -> None:
    with pytest.raises(BadInput, match=named):
        conf.task_env(env)


# -- the munge key ----------------------------------------------------------------------------

def test_the_munge_key_is_made_once_0600_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "private" / "munge.key"
    munge.ensure_key(path)
    first = path.read_bytes()
    assert len(first) == munge.KEY_BYTES and len(set(first)) > 200  # random bytes, not a constant
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert munge.ensure_key(path) == path and path.read_bytes() == first  # one key per cluster
    assert sorted(p.name for p in path.parent.iterdir()) == ["munge.key"]  # no temporary left
    other = tmp_path / "other.key"
    munge.ensure_key(other)
    assert other.read_bytes() != first


def test_a_readable_or_short_key_file_is_refused_not_replaced(tmp_path: Path) -> None:
    path = tmp_path / "munge.key"
    munge.write_key(path, b"k" * 64)
    os.chmod(path, 0o644)
    with pytest.raises(GpuprovError, match="chmod 600"):
        munge.ensure_key(path)
    short = tmp_path / "short.key"
    short.write_bytes(b"x" * 8)
    with pytest.raises(GpuprovError, match="no munge key"):
        munge.ensure_key(short)
    assert short.read_bytes() == b"x" * 8
    with pytest.raises(GpuprovError, match="at least 32"):
        munge.write_key(tmp_path / "tiny.key", b"x")


# -- names and interfaces a job needs (issue 53, section 0) -----------------------------------
def test_every_node_resolves_every_other_nodes_slurm_name() -> None:
    """The /etc/hosts block: one `address name` line per node with an IP address, sorted, the
    controller too where it is not a compute node; a DNS name is left to DNS."""
    two = SlurmNode(**{**vars(local()), "name": "demo-2", "addr": "172.17.0.4"})
    named = SlurmNode(**{**vars(local()), "name": "demo-3", "addr": "node3.example.internal"})
    assert conf.hosts_entries(cluster(two, local(), named)) == "172.17.0.3 demo-1\n172.17.0.4 demo-2"
    ctl = SlurmCluster(cluster_name="train", controller="head", controller_addr="10.0.0.2", nodes=(local(),))
    assert conf.hosts_entries(ctl) == "172.17.0.3 demo-1\n10.0.0.2 head"
    v6 = SlurmNode(**{**vars(local()), "addr": "fe80::1%eth0"})
    assert conf.hosts_entries(cluster(v6)) == "fe80::1%eth0 demo-1"


@pytest.mark.parametrize("addr", ["fe80::1%eth0\n10.0.0.9 head", "fe80::1%eth0 evil", "10.0.0.1 extra"])
def test_a_hosts_entry_that_could_add_a_line_or_a_name_is_refused(addr: str) -> None:
    with pytest.raises(BadInput, match="addr"):
        conf.hosts_entries(cluster(SlurmNode(**{**vars(local()), "addr": addr})))


# Facts as Ansible gathers them on a local node with Docker installed: its own eth0, and
# docker0 with the address Docker gives its bridge on every node.
DOCKER_NODE_FACTS = {
    "default_ipv4": {"address": "172.18.0.3", "interface": "eth0"},
    "interfaces": ["lo", "eth0", "docker0"],
    "lo": {"ipv4": {"address": "127.0.0.1"}},
    "eth0": {"ipv4": {"address": "172.18.0.3"}},
    "docker0": {"ipv4": {"address": "172.17.0.1"}},
}


def test_open_mpi_is_kept_to_the_interface_of_the_nodes_slurm_address() -> None:
    assert conf.tcp_interface(DOCKER_NODE_FACTS) == "eth0"
    # NodeAddr given (a node on two networks): the interface holding that address.
    facts = {**DOCKER_NODE_FACTS, "interfaces": ["lo", "eth0", "ens6"],
             "ens6": {"ipv4": {"address": "10.1.0.7"}, "ipv4_secondaries": [{"address": "10.1.0.8"}]}}
    assert conf.tcp_interface(facts, "10.1.0.8") == "ens6"
    # An interface Ansible names with '-' keeps its facts under '_'.
    dashed = {"default_ipv4": {"address": "10.2.0.5"}, "interfaces": ["br-lan"],
              "br_lan": {"ipv4": {"address": "10.2.0.5"}}}
    assert conf.tcp_interface(dashed) == "br-lan"
    assert conf.tcp_interface({"interfaces": ["eth0"]}) == ""  # no address: nothing set
    assert conf.tcp_interface(DOCKER_NODE_FACTS, "192.0.2.1") == ""  # held by no interface


def test_an_interface_name_that_could_add_a_line_is_refused() -> None:
    facts = {"default_ipv4": {"address": "10.2.0.5"}, "interfaces": ["eth0\nexport LD_PRELOAD=/x"],
             "eth0\nexport LD_PRELOAD=/x": {"ipv4": {"address": "10.2.0.5"}}}
    with pytest.raises(BadInput, match="interface name"):
        conf.tcp_interface(facts)


# -- GPU sharing (`--gpu-sharing`, docs/gpu-sharing.md#in-slurm): GresTypes, each GPU node's Gres=
# and gres.conf for a MIG layout (gpu typed by MIG profile), shards and MPS, with the layouts'
# instances from gpuprov's data files ----------------------------------------------------------

def _layout(value: str, itype: str = "p5.48xlarge") -> dict[str, int]:
    return layouts.role_inputs(choice.parse(value), catalog.find(itype), None)["instances"]


def _gres(text: str) -> list[str]:
    return text.splitlines()[1:]


def test_a_mig_layout_is_its_instances_typed_by_profile() -> None:
    balanced = cluster(p5(), h100(), local(), gpu_sharing="mig:all-balanced", gpu_sharing_instances=_layout(
        "mig:all-balanced"))
    text = conf.slurm_conf(balanced)
    assert "GresTypes=gpu" in text.splitlines()
    # 8 GPUs x (2 x 1g.10gb + 2g.20gb + 3g.40gb); the recorded H100 VM has one GPU.
    assert " Gres=gpu:1g.10gb:16,gpu:2g.20gb:8,gpu:3g.40gb:8 " in node_line(text, "p5-1")
    assert " Gres=gpu:1g.10gb:2,gpu:2g.20gb:1,gpu:3g.40gb:1 " in node_line(text, "h100-1")
    assert " Gres=" not in node_line(text, "demo-1")
    # Without Slurm's NVML plugin (Debian 12): each profile's count, no device files.
    assert _gres(conf.gres_conf(balanced)) == [
        "NodeName=p5-1 AutoDetect=off Name=gpu Type=1g.10gb Count=16",
        "NodeName=p5-1 AutoDetect=off Name=gpu Type=2g.20gb Count=8",
        "NodeName=p5-1 AutoDetect=off Name=gpu Type=3g.40gb Count=8",
        "NodeName=h100-1 AutoDetect=off Name=gpu Type=1g.10gb Count=2",
        "NodeName=h100-1 AutoDetect=off Name=gpu Type=2g.20gb Count=1",
        "NodeName=h100-1 AutoDetect=off Name=gpu Type=3g.40gb Count=1",
    ]
    # With it: NVML finds the MIG devices and their types.
    seven = cluster(h100(nvml=True), gpu_sharing="mig:all-1g.10gb", gpu_sharing_instances=_layout("mig:all-1g.10gb"))
    assert " Gres=gpu:1g.10gb:7 " in node_line(conf.slurm_conf(seven), "h100-1")
    assert _gres(conf.gres_conf(seven)) == ["NodeName=h100-1 AutoDetect=nvml"]


def test_shards_and_mps_are_counted_per_gpu_beside_the_whole_gpus() -> None:
    shards = cluster(p5(), local(), gpu_sharing="shard:4")
    text = conf.slurm_conf(shards)
    assert "GresTypes=gpu,shard" in text.splitlines()
    assert " Gres=gpu:h100:8,shard:32 " in node_line(text, "p5-1")
    assert _gres(conf.gres_conf(shards)) == ["NodeName=p5-1 AutoDetect=off Name=gpu Type=h100 File=/dev/nvidia[0-7]",
                                             "NodeName=p5-1 Name=shard Count=32"]
    mps = cluster(h100(nvml=True), gpu_sharing="mps")
    assert "GresTypes=gpu,mps" in conf.slurm_conf(mps).splitlines()
    assert " Gres=gpu:h100:1,mps:100 " in node_line(conf.slurm_conf(mps), "h100-1")
    assert _gres(conf.gres_conf(mps)) == ["NodeName=h100-1 AutoDetect=nvml", "NodeName=h100-1 Name=mps Count=100"]


def test_no_sharing_is_the_whole_gpus_as_before() -> None:
    assert conf.slurm_conf(cluster(p5(), gpu_sharing="none")) == conf.slurm_conf(cluster(p5()))
    assert conf.gres_conf(cluster(p5(), gpu_sharing="none")) == conf.gres_conf(cluster(p5()))


def test_a_layout_without_its_instances_stops_on_a_gpu_node_only() -> None:
    assert conf.gres_conf(cluster(local(), gpu_sharing="mig:all-1g.10gb")).splitlines()[1:] == []
    with pytest.raises(BadInput, match=re.escape("node p5-1: gpu_sharing mig:all-1g.10gb: the layout's instances")):
        conf.slurm_conf(cluster(p5(), gpu_sharing="mig:all-1g.10gb"))


@pytest.mark.parametrize(("sharing", "instances", "said"), [
    ("mig:all-1g.10gb\nGresTypes=x", {"1g.10gb": 7}, "expected mig:LAYOUT, mps, shard:N or none"),
    ("shard:1", {}, "from 2 to 64"),
    ("shard:65", {}, "from 2 to 64"),
    ("mig:all-1g.10gb.me", {"1g.10gb+me": 1}, "a +me profile is no Slurm GRES type"),
    ("mig:x", {"1g.10gb File=/etc/shadow": 1}, "a MIG profile such as 1g.10gb"),
    ("mig:x", {"1g.10gb": 8}, "from 1 to 7"),
])
def test_a_value_that_could_add_a_line_or_a_parameter_is_refused(sharing: str, instances: dict, said: str) -> None:
    with pytest.raises(BadInput, match="gpu_sharing") as exc:
        conf.gres_conf(cluster(p5(), gpu_sharing=sharing, gpu_sharing_instances=instances))
    assert said in str(exc.value)
