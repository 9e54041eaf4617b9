"""gpuprov's command line (click), one module per command or command group: ``app`` holds the
group, the cluster's own commands (up, down, list, status, provision, verify, exec, settings,
inventory) and ``main``, the entry point; ``health``, ``image``, ``monitor``, ``patch``, ``ssh``
and ``stack`` (stack and types) their commands; ``options`` the flags and their bounds,
``output`` and ``table`` what the commands print, ``budget`` and ``local`` the parts of `up
--max-price` and of `verify|health --local`.

Nothing is imported here: `gpuprov --help` loads only what it needs (tests/unit/
test_startup_imports.py), and no command's name shadows its module."""
