"""The commands: one module per command or capability, each public function what one CLI
command calls, named after it (up, down, status: list/status/inventory/settings, provision,
verify, patch, onto_image (patch --onto-image), min_count (up --min-count), counts, baking,
monitoring, remote, local).

They validate first (``BadInput`` before anything is created or changed), then act, then
return a frozen dataclass of gpuprov/results/shapes.py (the JSON shapes of
docs/json-output.md; `down`, which prints no JSON, a small dict). What they share with
health and pull lives below all three (gpuprov.cluster, gpuprov.settings, gpuprov.results,
gpuprov.slurm; docs/design.md's layers); this package's ``__init__``
imports nothing, so importing one command loads only what that command needs.
"""
