#!/usr/bin/env bash
# Print the environment the local flow uses on this machine (eval it):
#   GPUPROV_APT_PROXY        the package cache nodes use (apt-cacher-ng on the bridge gateway)
#   GPUPROV_ARTIFACT_MIRROR  the local artifact mirror (scripts/artifact-mirror.sh)
#   GPUPROV_REGISTRY_MIRROR, GPUPROV_CONTAINER_TOOLKIT_REPO(_FPR)  scripts/registry.sh
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
gateway=$(bridge_gateway)
echo "export GPUPROV_APT_PROXY=${GPUPROV_APT_PROXY:-http://$gateway:3142}"
echo "export GPUPROV_ARTIFACT_MIRROR=${GPUPROV_ARTIFACT_MIRROR:-http://$gateway:8089}"
# The local image registry and the container toolkit repository (scripts/registry.sh).
echo "export GPUPROV_REGISTRY_MIRROR=${GPUPROV_REGISTRY_MIRROR:-http://$gateway:5000}"
echo "export GPUPROV_CONTAINER_TOOLKIT_REPO=${GPUPROV_CONTAINER_TOOLKIT_REPO:-http://$gateway:8090/}"
echo "export GPUPROV_CONTAINER_TOOLKIT_REPO_FPR=${GPUPROV_CONTAINER_TOOLKIT_REPO_FPR:-$(cat "${GPUPROV_REGISTRY_DIR:-/var/cache/gpuprov-registry}/toolkit-repo/fingerprint" 2>/dev/null || true)}"
# The digests the local registry serves under the lock's image names (JSON; a fixture image is not
# NVIDIA's, so the lock's own digests are not served there).
digests=$(cat "${GPUPROV_REGISTRY_DIR:-/var/cache/gpuprov-registry}/digests.json" 2>/dev/null || echo '{}')
printf 'export GPUPROV_REGISTRY_DIGESTS=%q\n' "${GPUPROV_REGISTRY_DIGESTS:-$digests}"
