#!/usr/bin/env bash
# Prepare this machine to run gpuprov's local (docker) nodes and its test suite.
#
# Idempotent: installs only what is missing, starts only what is stopped,
# builds the node image only when it does not exist yet.
#   - Docker engine from the distribution (docker.io) when no engine answers
#   - debootstrap (node images are built from the distribution archive:
#     no image registry is assumed to be reachable)
#   - the local node image (scripts/build-node-image.sh)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
image=${GPUPROV_NODE_IMAGE:-gpuprov/node:bookworm}

log() { printf '[host-setup] %s\n' "$*" >&2; }

need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    log "this step needs root ($*); re-run as root or install it yourself"
    exit 1
  fi
}

apt_updated=0
apt_install() {
  need_root "apt-get install $*"
  if [ "$apt_updated" -eq 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    apt_updated=1
  fi
  log "installing $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# --- tools ---------------------------------------------------------------
missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
command -v ssh >/dev/null 2>&1 || missing+=(openssh-client)
command -v ssh-keygen >/dev/null 2>&1 || missing+=(openssh-client)
if [ "${#missing[@]}" -gt 0 ]; then
  # shellcheck disable=SC2207
  uniq=($(printf '%s\n' "${missing[@]}" | sort -u))
  apt_install "${uniq[@]}"
fi

# --- docker engine -------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
  need_root "start dockerd"
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    log "starting docker with systemctl"
    systemctl start docker
  else
    log "starting dockerd in the background (log: /var/log/gpuprov-dockerd.log)"
    (setsid dockerd >/var/log/gpuprov-dockerd.log 2>&1 &)
  fi
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  if ! docker info >/dev/null 2>&1; then
    log "the Docker engine did not come up; see /var/log/gpuprov-dockerd.log"
    exit 1
  fi
fi

# --- node image ----------------------------------------------------------
if docker image inspect "$image" >/dev/null 2>&1; then
  log "node image $image present"
else
  "$here/build-node-image.sh" "$image"
fi
