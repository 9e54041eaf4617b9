"""A converged node's manifest: what the plays manage there, derived from the run's own task
results (collect), recorded on the node by a standard-library program (node) shipped over the
cluster's pinned SSH (remote), and compared with the state's record before `provision` runs
Ansible on it again (record). How it is used: docs/performance-history.md (2026-11-27, the
manifests) and docs/cli.md's provision."""
