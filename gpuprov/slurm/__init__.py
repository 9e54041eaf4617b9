"""Slurm for a gpuprov cluster: its configuration files (``conf``, the slurm role's rules) and
its munge key (``munge``)."""
