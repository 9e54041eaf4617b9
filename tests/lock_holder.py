"""The lock's holder in the tests of the local lock (tests/unit/test_cluster_lock.py) and of the
S3 state's (tests/aws/test_team_state.py)."""

# A second process that runs the real CLI command's context (what `gpuprov provision NAME` is
# while it runs) and holds the cluster's lock until its stdin closes.
HOLDER = """
import sys, click
from gpuprov.cli.app import cli
from gpuprov.cluster import cluster_lock
with click.Context(cli, info_name="gpuprov") as root, \\
        click.Context(cli.commands[sys.argv[1]], info_name=sys.argv[1], parent=root):
    with cluster_lock(sys.argv[2]):
        print("held", flush=True)
        sys.stdin.readline()
"""
