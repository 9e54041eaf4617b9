"""Every default and every closed list of choices that more than one layer reads: written once
here, read by the CLI (its defaults and `click.Choice` lists) and by the modules that act on
them. Nothing here imports anything, so `gpuprov --help` pays nothing for it.
"""

from __future__ import annotations

# The CUDA release a new cluster gets without --cuda: what gpuprov was asked to install, and
# what many pinned stacks still use (gpuprov.lock.drivers: the minimum driver of each release).
DEFAULT_CUDA = "11.8"

# Where the NVIDIA stack's packages come from (`--source`; gpuprov.lock.stack.resolve_types).
PACKAGE_SOURCES = ("nvidia", "distro", "mirror")
# Local Debian nodes take Debian's packages; every other node NVIDIA's repositories.
DEFAULT_SOURCE = "nvidia"
LOCAL_SOURCE = "distro"

# The kernel module flavours of NVIDIA's driver (`--kernel-module`; gpuprov.lock.drivers).
KERNEL_MODULES = ("open", "proprietary")

# The operating systems a version lock names (`stack --os`; the lock's `os`, its package facts:
# gpuprov.lock.os_lines). A lock without one is Debian 12's. Ubuntu 24.04: claimed, not proven here
# (gpuprov.platforms): NVIDIA's repository names read off its public documents.
LOCK_OS = ("debian12", "debian13", "ubuntu24.04")
DEFAULT_OS = "debian12"

# The operating systems an aws node can launch with (`up --os`; their images:
# gpuprov.providers.aws.preflight.IMAGE_SOURCES, their facts: gpuprov.platforms).
AWS_OS = ("debian12", "debian13", "ubuntu22.04", "ubuntu24.04")
DEFAULT_AWS_OS = "debian12"
# The operating systems of local (docker) nodes: one node image each
# (gpuprov.providers.docker.NODE_IMAGES, built by scripts/build-node-image.sh).
LOCAL_OS = ("debian12", "debian13")
# Every `up --os` value: each provider checks its own (static: a claim checked on the hosts).
UP_OS = tuple(dict.fromkeys(AWS_OS + LOCAL_OS))

# `up --scheduler`: what runs the cluster's jobs (none: `gpuprov exec` and SSH only).
SCHEDULERS = ("none", "slurm")
DEFAULT_SCHEDULER = "none"

# The free space the preflight asks of a node's root file system before it installs anything
# (roles/gpu_preflight/defaults/main.yml gpu_preflight_root_free_gib: the driver, CUDA, cuDNN,
# the base images and room for a patch), and of a local node, which shares this machine's disk
# and pulls the local registry's small images (gpuprov.ansible.inventory).
NODE_FREE_GIB = 40
LOCAL_NODE_FREE_GIB = 20
# What an aws node's own image takes of its root volume, at most, for the images gpuprov picks
# (Debian's and Canonical's AMIs: an 8 GiB root snapshot): --disk-gb below NODE_FREE_GIB plus
# this leaves the preflight too little, so `up` refuses it before launching anything.
AWS_IMAGE_ROOT_GIB = 8

# The bounds of every number the command line takes (click.IntRange, each shown in `--help`):
# checked when the flag is read, before anything is created or changed.
# A cluster's nodes (`up --count`, `--min-count`, `patch --batch`), for every provider: on aws
# one all-or-nothing RunInstances in one zone (the reasons: gpuprov.providers.aws.common
# MAX_COUNT; docs/scale.md).
MAX_NODES = 256
# `up --min-count --retries`: rounds of replacements (default 1; past a few, more launches only
# cost more: the image or the plays are at fault).
MAX_RETRIES = 10
# A node's GPUs (`types --gpus`, `verify|health --local --gpus`): well above the 16 of the
# largest single machines (DGX-2), every type gpuprov knows has at most 8.
MAX_NODE_GPUS = 64
# One GPU's memory in GiB (`types --min-gpu-mem`): B200's is 180.
MAX_GPU_MEM_GIB = 1024
# `--gpu-sharing shard:N`: Slurm shards per GPU (gres/shard). Slurm sets no bound; gpuprov's is 64,
# nine times MIG's 7 instances: past it each job's share of the GPU's time is too thin to be worth
# a slot (docs/gpu-sharing.md). shard:1 is the whole GPU, so the least is 2.
MAX_GPU_SHARDS = 64
# `patch --grace`: seconds a drained node's jobs get to end (default 1800): at most a week.
MAX_GRACE_S = 7 * 24 * 3600
# aws root volume (`up --disk-gb`, GiB): EBS gp3 takes at most 16384; the least is the free
# space the preflight asks (NODE_FREE_GIB) beside the image's own share (AWS_IMAGE_ROOT_GIB),
# NODE_FREE_GIB alone with --image (its share is its owner's to know).
MAX_DISK_GB = 16384
# `up|types --max-price` (US dollars per instance-hour): the dearest type gpuprov knows costs
# about $114/h on demand (p6-b200.48xlarge); past this a budget is a typo, not a budget.
MAX_PRICE_USD = 1000.0

# Dynamic Slurm nodes (`--idle-minutes`): a node's idle minutes before it is powered down
# (ParallelCluster's ScaledownIdletime default), at most a week.
DEFAULT_IDLE_MINUTES = 10
MAX_IDLE_MINUTES = 7 * 24 * 60
