"""The version lock: what a command asks of it (``stack_choice``, a leaf the command line builds
without loading the lock's data), the lock itself and how it is resolved (``stack``), and the
rules and facts it is resolved from: the driver branches (``drivers``), the CUDA lines
(``cuda_lines``) and the operating systems (``os_lines``), read from gpuprov/data/stack.toml.

This ``__init__`` imports nothing, so the command line's ``StackChoice`` costs no data at
start-up; import each module by its name (``from gpuprov.lock import stack``).
"""
