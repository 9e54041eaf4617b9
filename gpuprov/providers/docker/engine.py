"""The Docker engine as the docker provider uses it: the one call (``docker ...``) and the labels
that say what belongs to gpuprov (the engine, not the state file, says what exists)."""

from __future__ import annotations

import subprocess

from gpuprov.errors import BadInput, GpuprovError

LABEL = "gpuprov.cluster"
NODE_LABEL = "gpuprov.node"
# A dynamic Slurm node's container (gpuprov.providers.docker.power): Slurm's, never one of the
# nodes gpuprov records and bootstraps; `down` removes it with the cluster's.
DYNAMIC_LABEL = "gpuprov.dynamic"
# Baked images (gpuprov image bake): this repository, tagged LOCKHASH-TIME, labelled with the
# lock. GPUPROV_BAKED_REPO names another (each test session of gpuprov's suite takes its own).
BAKED_REPO = "gpuprov/baked"
IMAGE_LABEL = "gpuprov.lock"


def docker(
    *args: str, check: bool = True, input: bytes | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[bytes]:
    try:
        proc = subprocess.run(
            ["docker", *args], capture_output=True, input=input, check=False, timeout=timeout
        )
    except FileNotFoundError:
        raise BadInput("no docker client found; install Docker (make host-setup does it)") from None
    except subprocess.TimeoutExpired:
        raise GpuprovError(f"docker {args[0]} did not answer within {timeout:.0f}s") from None
    if check and proc.returncode != 0:
        raise GpuprovError(f"docker {args[0]} failed: {proc.stderr.decode().strip()}")
    return proc
