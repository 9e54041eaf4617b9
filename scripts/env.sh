#!/usr/bin/env bash
# Print the environment the local flow uses on this machine (eval it):
#   GPUPROV_APT_PROXY        the package cache nodes use (apt-cacher-ng on the bridge gateway)
#   GPUPROV_ARTIFACT_MIRROR  the local artifact mirror (scripts/artifact-mirror.sh)
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
gateway=$(bridge_gateway)
echo "export GPUPROV_APT_PROXY=${GPUPROV_APT_PROXY:-http://$gateway:3142}"
echo "export GPUPROV_ARTIFACT_MIRROR=${GPUPROV_ARTIFACT_MIRROR:-http://$gateway:8089}"
