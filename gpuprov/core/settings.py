"""What every play of a cluster is given besides the lock: where packages, artifacts and
images come from, and the secrets a play reads from the controller."""

from __future__ import annotations

import os
from typing import Any

from gpuprov.state import ClusterRecord


def playbook_vars(cluster: ClusterRecord, lock: dict[str, Any]) -> dict[str, Any]:
    """The extra variables every play of a cluster gets: the lock and where packages come from."""
    options = cluster.spec.get("options") or {}
    return {
        "gpuprov_stack": lock,
        "gpuprov_artifact_mirror": os.environ.get("GPUPROV_ARTIFACT_MIRROR", ""),
        "gpuprov_registry_mirror": os.environ.get("GPUPROV_REGISTRY_MIRROR", ""),
        "gpuprov_container_toolkit_repo_url": os.environ.get("GPUPROV_CONTAINER_TOOLKIT_REPO", ""),
        "gpuprov_container_toolkit_repo_key_fingerprint": os.environ.get(
            "GPUPROV_CONTAINER_TOOLKIT_REPO_FPR", ""),
        "gpuprov_mirror_url": options.get("mirror_url", ""),
        "gpuprov_mirror_key_fingerprint": options.get("mirror_key_fingerprint", ""),
    }


# Secrets a play reads from the controller: (environment variable, play variable that names
# a file). They reach the play through a file on a memory file system for the length of the
# run (gpuprov.ansible.runner.SecretFiles), never through its environment, its variables or
# its artifacts.
PLAY_SECRETS = (("GPUPROV_REGISTRY_PASSWORD", "base_images_registry_password_file"),)


def play_secrets() -> dict[str, str]:
    return {var: os.environ[env] for env, var in PLAY_SECRETS if os.environ.get(env)}
