"""GPU sharing: one GPU for many jobs (MIG partitions, MPS, Slurm shards), as the version lock
records it (``--gpu-sharing``; docs/gpu-sharing.md).

``choice`` reads the option's value (a leaf: the command line parses it without loading data),
``layouts`` holds each GPU model's named MIG layouts (gpuprov/data/mig/) and checks a choice
against the hosts' GPUs, ``smi`` parses what nvidia-smi says of MIG on a node, and ``plan``
turns the desired sharing and a node's state into the ordered steps that would apply it.

This ``__init__`` imports nothing; import each module by its name.
"""
