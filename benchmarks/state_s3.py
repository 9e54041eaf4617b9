#!/usr/bin/env python3
"""What the state on S3 costs a command (docs/team-state.md; a figure, not a test).

    python benchmarks/state_s3.py [--repeat 5]

Against moto's server on this machine (no network latency: on AWS, each request below adds one
round trip to S3, typically 10 to 30 ms in the same region, more across regions):

- the S3 requests of each state operation (counted as botocore sends them), and of the commands
  that lock a cluster: the lock taken, the record read and written, the lock released;
- the wall time of `gpuprov settings NAME` (a no-op read) and of `gpuprov settings NAME --set
  KEY=VALUE` (a locked change with no node involved), each as a subprocess, the median of
  ``--repeat`` runs, with the local state and with the S3 state: the difference is what the S3
  state adds to any command (a no-op `provision` reads the record and takes the lock the same
  way; its nodes' time is the same with either state).

Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _environment(moto: str, home: Path) -> None:
    os.environ.update({
        "AWS_ENDPOINT_URL": f"http://{moto}", "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(home / "no-aws-config"), "AWS_SHARED_CREDENTIALS_FILE": str(home / "no-aws-creds"),
        "GPUPROV_HOME": str(home / "state"), "GPUPROV_CONFIG": str(home / "settings.toml"),
    })


def counted(what: str, step: object) -> tuple[str, int]:
    from gpuprov import state_s3

    before = sum(state_s3.SENT.values())
    step()  # type: ignore[operator]
    return what, sum(state_s3.SENT.values()) - before


def requests_per_operation() -> list[tuple[str, int]]:
    import click

    import gpuprov.state_s3  # noqa: F401  (the S3 backend, as the command line loads it)
    from gpuprov.cli.app import cli
    from gpuprov.cluster import cluster_lock
    from gpuprov.core import status
    from gpuprov.state import Store

    store = Store()
    out = [counted("create a cluster's record", lambda: store.create_cluster("demo", "static", {"options": {}}))]
    out.append(counted("read a record (get_cluster)", lambda: Store().get_cluster("demo")))
    out.append(counted("change a record read by this process (set_spec)", lambda: store.set_spec("demo", {"x": 1})))

    def locked() -> None:
        with click.Context(cli, info_name="gpuprov"), cluster_lock("demo"):
            pass

    out.append(counted("take and release the lock (no write between; no pinned host keys here)", locked))
    out.append(counted("`gpuprov settings demo --set root_free_gib=30` (read, lock, host keys, re-read, write, unlock)",
                       lambda: status.change_settings("demo", {"root_free_gib": "30"})))
    run: list[int] = []
    out.append(counted("start a run", lambda: run.append(Store().start_run("demo", "provision", None))))
    out.append(counted("finish it (same process)", lambda: Store().finish_run(run[0], True, {})))
    out.append(counted("the last 5 runs (status), 1 run there", lambda: Store().runs("demo", limit=5)))
    for i in range(9):
        Store().create_cluster(f"more-{i}", "static", {})
    out.append(counted("list the clusters' records (10 clusters)", lambda: Store().list_clusters()))
    return out


def wall(args: list[str], env: dict[str, str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "gpuprov", *args], env=env, check=True, capture_output=True,
                       stdin=subprocess.DEVNULL)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    from moto.server import ThreadedMotoServer

    from tests.aws.s3_front import Front

    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    # S3 through the tests' front (tests/aws/s3_front.py): it keeps bucket policies itself, as moto
    # would apply the TLS-only policy's Deny to these plain-HTTP requests (it ignores Conditions).
    front = Front(f"{host}:{port}")
    os.environ["AWS_ENDPOINT_URL_S3"] = front.url
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        _environment(f"{host}:{port}", home)
        subprocess.run([sys.executable, "-m", "gpuprov", "state", "bucket", "s3://bench-state/fleet"], check=True,
                       capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        os.environ["GPUPROV_STATE"] = "s3://bench-state/fleet"
        rows = requests_per_operation()
        print("| operation | S3 requests |\n|---|---|")
        for what, n in rows:
            print(f"| {what} | {n} |")
        s3_env = {**os.environ, "PYTHONPATH": str(ROOT)}
        local_env = {**s3_env, "GPUPROV_STATE": "local", "GPUPROV_HOME": str(home / "local")}
        subprocess.run([sys.executable, "-c", "from gpuprov.state import Store; "
                        "Store().create_cluster('demo', 'static', {'options': {}})"], env=local_env, check=True)
        print(f"\n| command (median of {args.repeat}, subprocess) | local state | S3 state (moto, this machine) "
              "| added |\n|---|---|---|---|")
        for command in (["settings", "demo"], ["settings", "demo", "--set", "root_free_gib=30"]):
            local = wall(command, local_env, args.repeat)
            remote = wall(command, s3_env, args.repeat)
            print(f"| `gpuprov {' '.join(command)}` | {local:.2f} s | {remote:.2f} s | {remote - local:+.2f} s |")
    front.close()
    moto.stop()


if __name__ == "__main__":
    main()
