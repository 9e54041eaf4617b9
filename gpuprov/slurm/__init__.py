"""Slurm for a gpuprov cluster, in one place: what a command asks of the scheduler
(``scheduler_choice``, a leaf), the cluster's scheduler as its record keeps it and the slurm
play's variables (``scheduler``), `patch`'s drains and resumes (``drain``), the configuration
files (``conf``, the slurm role's rules), the munge key (``munge``) and elastic clusters' names,
checks and power requests (``elastic``). This ``__init__``
imports nothing, so the command line's ``Scheduler`` loads none of the rest."""
