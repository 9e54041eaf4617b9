"""testinfra probes: one probe checks one thing and says what it found.

The same files serve ``gpuprov verify`` (over the cluster's generated
inventory, testinfra's ansible backend) and the roles' molecule verifiers.
What a node should have comes from ``GPUPROV_EXPECTATIONS`` (written by
gpuprov from the catalog and the provider); see conftest.py.
"""
