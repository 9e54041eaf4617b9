"""What commands return and print as JSON (docs/json-output.md): ``shapes``, the frozen
dataclasses of every command's result; ``costs``, the price and cost parts of them;
``manifest``, a node's manifest verdict; ``json_form``, how a shape becomes JSON (field names,
optional fields, serialise).

This ``__init__`` imports nothing: the node health program (gpuprov.health.node_bundle) ships
the modules it needs, and a module that needs one shape loads no other.
"""
