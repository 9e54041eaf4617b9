#!/usr/bin/env bash
# Prepare this machine to run gpuprov's local (docker) nodes and its test suite.
#
# Idempotent: installs only what is missing, starts only what is stopped,
# builds the node image only when it does not exist yet. Says what it will
# install, stop, start and build before it does any of it.
#   - Docker engine from the distribution (docker.io) when no engine answers
#   - debootstrap (node images are built from the distribution archive:
#     no image registry is assumed to be reachable)
#   - the local node image (scripts/build-node-image.sh)
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

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
# Test fixtures: a signed apt repository (dpkg-scanpackages, apt-ftparchive, gpg).
command -v dpkg-scanpackages >/dev/null 2>&1 || missing+=(dpkg-dev)
command -v apt-ftparchive >/dev/null 2>&1 || missing+=(apt-utils)
command -v gpg >/dev/null 2>&1 || missing+=(gnupg)
# The package cache the local nodes use: the 2.7 GB driver and toolkit are
# downloaded once per machine, not once per node or scenario.
[ -x /usr/sbin/apt-cacher-ng ] || missing+=(apt-cacher-ng)
# The local image registry (scripts/registry.sh): Debian's registry, and skopeo to
# push to it over plain HTTP without changing this machine's Docker configuration.
[ -x /usr/bin/docker-registry ] || missing+=(docker-registry)
command -v skopeo >/dev/null 2>&1 || missing+=(skopeo)
# gcc: the recorded-hardware node's FIXTURE libcuda.so.1 (tests/fixtures/recorded_node/libcuda.c).
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
# promtool (Debian's prometheus package): tests/unit/test_alert_rules.py proves the
# monitoring role's alert rules with it.
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
# --- what this run will do, said before it does any of it ------------------
uniq=()
if [ "${#missing[@]}" -gt 0 ]; then
  # shellcheck disable=SC2207
  uniq=($(printf '%s\n' "${missing[@]}" | sort -u))
fi
service_enabled() { [ -d /run/systemd/system ] && systemctl is-enabled "$1" >/dev/null 2>&1; }
plan=()
[ "${#uniq[@]}" -gt 0 ] && plan+=("install with apt: ${uniq[*]}")
for svc in docker-registry prometheus; do
  if service_enabled "$svc" || { [ -d /run/systemd/system ] && printf '%s\n' "${uniq[@]}" | grep -qx "$svc"; }; then
    plan+=("stop and disable the $svc service if enabled (it would listen on every interface; gpuprov runs its own registry on the docker bridge gateway, and needs only promtool from prometheus)")
  fi
done
docker info >/dev/null 2>&1 || plan+=("start the Docker engine (systemctl start docker, else dockerd in the background)")
[ "$(cat /etc/apt-cacher-ng/zz-gpuprov.conf 2>/dev/null)" = "ConnectProto: v4
BindAddress: 127.0.0.1 $(bridge_gateway)" ] ||
  plan+=("configure apt-cacher-ng to listen on 127.0.0.1 and the docker bridge gateway (/etc/apt-cacher-ng/zz-gpuprov.conf) and restart it")
docker image inspect "$image" >/dev/null 2>&1 ||
  plan+=("build the node image $image with debootstrap from the Debian archive (minutes)")
if [ "${#plan[@]}" -gt 0 ]; then
  log "this machine will be changed as follows:"
  for line in "${plan[@]}"; do log "  - $line"; done
fi

if [ "${#uniq[@]}" -gt 0 ]; then
  apt_install "${uniq[@]}"
fi

# The packaged registry service would listen on every interface: gpuprov runs its
# own, on the bridge gateway only (scripts/registry.sh).
if [ -d /run/systemd/system ] && systemctl is-enabled docker-registry >/dev/null 2>&1; then
  systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi
# Only promtool is wanted from the prometheus package: its server would listen on every
# interface (:9090).
if [ -d /run/systemd/system ] && systemctl is-enabled prometheus >/dev/null 2>&1; then
  systemctl disable --now prometheus >/dev/null 2>&1 || true
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

# --- package cache (apt-cacher-ng), reached by nodes through the bridge gateway --
gateway=$(bridge_gateway)
acng_conf=/etc/apt-cacher-ng/zz-gpuprov.conf
want="ConnectProto: v4
BindAddress: 127.0.0.1 $gateway"
if [ "$(cat "$acng_conf" 2>/dev/null)" != "$want" ]; then
  need_root "configure apt-cacher-ng"
  printf '%s\n' "$want" >"$acng_conf"
  # The Debian archive this machine's apt uses as the backend for the Debian remap (none
  # found: apt-cacher-ng's own list).
  debian=$(debian_mirror)
  if [ -n "$debian" ] && [ ! -s /etc/apt-cacher-ng/backends_debian ]; then
    echo "${debian%/}/" >/etc/apt-cacher-ng/backends_debian
  fi
  restart_acng=1
fi
if [ "${restart_acng:-0}" = 1 ] || ! (exec 3<>"/dev/tcp/127.0.0.1/3142") 2>/dev/null; then
  need_root "start apt-cacher-ng"
  if [ -d /run/systemd/system ]; then systemctl restart apt-cacher-ng; else /etc/init.d/apt-cacher-ng restart >/dev/null; fi
  for _ in $(seq 1 20); do (exec 3<>"/dev/tcp/127.0.0.1/3142") 2>/dev/null && break; sleep 0.5; done
fi
log "package cache: http://$gateway:3142 (apt-cacher-ng)"

# --- node image ----------------------------------------------------------
have=$(docker image inspect -f '{{index .Config.Labels "gpuprov.image-recipe"}}' "$image" 2>/dev/null || true)
if [ -n "$have" ] && [ "$have" = "$(recipe_hash)" ]; then
  log "node image $image present"
else
  [ -n "$have" ] && log "node image $image is from an older recipe: rebuilding"
  "$here/build-node-image.sh" "$image"
fi
