#!/usr/bin/env bash
# The local image registry and container toolkit repository the local nodes use
# (FIXTURES: no image registry and no NVIDIA download can be reached here).
#   - Debian's docker-registry on the docker bridge gateway only, port 5000, read-only,
#     holding a small image of the local Debian root filesystem under the names
#     of the lock's CUDA images, seeded through loopback (tests/fixtures/registry.py)
#   - a signed apt repository with the container toolkit's package names
#     (FIXTURE payloads: the runtime hands containers to runc) on port 8090
# Idempotent: builds and pushes only what is missing, starts only what is not
# running. Prints nothing on stdout.
#   scripts/registry.sh [start|stop]
# The environment the local flow needs (GPUPROV_REGISTRY_MIRROR,
# GPUPROV_CONTAINER_TOOLKIT_REPO, GPUPROV_CONTAINER_TOOLKIT_REPO_FPR,
# GPUPROV_REGISTRY_DIGESTS) is:
#   http://GATEWAY:5000, http://GATEWAY:8090/, $dir/toolkit-repo/fingerprint,
#   the content of $dir/digests.json (the digests this registry serves under the lock's
#   image names: the fixture is not NVIDIA's image, so the lock's digests are not here)
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON_BIN:-$here/.venv/bin/python}
dir=${GPUPROV_REGISTRY_DIR:-/var/cache/gpuprov-registry}
port=${GPUPROV_REGISTRY_PORT:-5000}
repo_port=${GPUPROV_TOOLKIT_REPO_PORT:-8090}
log() { printf '[registry] %s\n' "$*" >&2; }
running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

if [ "${1:-start}" = stop ]; then
  for pidfile in "$dir/registry.pid" "$dir/toolkit-repo.pid"; do
    running "$pidfile" && kill "$(cat "$pidfile")"
    rm -f "$pidfile"
  done
  exit 0
fi

gateway=$(bridge_gateway)
mkdir -p "$dir"
cd "$here"
# Seeded first, through a registry of its own on loopback (the served one refuses writes), with
# the digests skopeo computed of what it pushed; then served read-only on the bridge (an older,
# writable registry of an earlier gpuprov is replaced), and held to those digests.
# shellcheck disable=SC2046
"$python" -m tests.fixtures.registry seed --dir "$dir" --digests "$dir/digests.json" \
  $("$python" -c 'from gpuprov.lock import stack; print(" ".join(stack.resolve(None, source="distro").base_images))')
if running "$dir/registry.pid" && grep -q '"readonly"' "$dir/config.yml" 2>/dev/null; then
  log "registry on $gateway:$port, read-only (already running)"
else
  if running "$dir/registry.pid"; then
    kill "$(cat "$dir/registry.pid")"
    for _ in $(seq 1 50); do running "$dir/registry.pid" || break; sleep 0.1; done
  fi
  "$python" -m tests.fixtures.registry serve --bind "$gateway" --port "$port" --dir "$dir" >"$dir/registry.pid"
  log "registry on $gateway:$port, read-only"
fi
"$python" -m tests.fixtures.registry check --registry "$gateway:$port" --dir "$dir"
log "seeded: the lock's CUDA image names (FIXTURE: a Debian image); digests (skopeo's, of what it pushed) in $dir/digests.json"

fpr=$("$python" -m tests.fixtures.registry toolkit-repo "$dir/toolkit-repo")
if running "$dir/toolkit-repo.pid"; then
  log "toolkit repository on http://$gateway:$repo_port/ (already running), key $fpr"
else
  setsid "$python" -m http.server --bind "$gateway" --directory "$dir/toolkit-repo" "$repo_port" \
    >"$dir/toolkit-repo.log" 2>&1 </dev/null &
  echo $! >"$dir/toolkit-repo.pid"
  for _ in $(seq 1 50); do
    (exec 3<>"/dev/tcp/$gateway/$repo_port") 2>/dev/null && break
    sleep 0.1
  done
  log "toolkit repository on http://$gateway:$repo_port/, key $fpr"
fi
