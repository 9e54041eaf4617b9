"""How the end-to-end units drive their nodes: the Ansible strategy the suite gives them."""

from __future__ import annotations

import os

# The e2e units run Ansible with Mitogen's strategy (GPUPROV_ANSIBLE_STRATEGY=mitogen; the test
# extra installs it): about half of the suite's CPU was Ansible's own per-task work, on the nodes
# and here (docs/performance-history.md, 2026-12-02 (4)), most of which Mitogen does once per node
# and run. The node from scratch (tests/e2e/test_docker_cluster.py) keeps Ansible's own linear
# strategy, the default users get, so the whole site is proven from scratch on it; the unit tests,
# molecule's scenarios and tests/unit/test_check_would_change.py keep the default too.
# GPUPROV_SUITE_STRATEGY=linear runs every unit on Ansible's own strategy.
SUITE_STRATEGY = os.environ.get("GPUPROV_SUITE_STRATEGY", "mitogen")
