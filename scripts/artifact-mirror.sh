#!/usr/bin/env bash
# The local artifact mirror, as an air-gapped site would run one: build the
# artifacts gpuprov installs from archives (the cuDNN redist archives and CUDA
# 13.0's redist archives, rebuilt reproducibly from the pinned PyPI wheels and
# checked against the lock's sha256s), then serve them over HTTP on the docker bridge gateway, where the
# local nodes reach it. Idempotent: builds only what is missing, starts only
# when not running.
#   scripts/artifact-mirror.sh [start|stop]
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON_BIN:-$here/.venv/bin/python}
dir=${GPUPROV_ARTIFACTS:-/var/cache/gpuprov-artifacts}
port=${GPUPROV_ARTIFACT_PORT:-8089}
pidfile=$dir/serve.pid
log() { printf '[artifact-mirror] %s\n' "$*" >&2; }

if [ "${1:-start}" = stop ]; then
  [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  rm -f "$pidfile"
  exit 0
fi

mkdir -p "$dir/mirror"
log "building artifacts in $dir/mirror (first time: downloads the cuDNN 8.9 wheel, ~700 MB, CUDA 13.0's wheels, ~650 MB, and cuDNN 9's for CUDA 12, ~700 MB, and repacks them)"
"$python" -m gpuprov.artifacts build "$dir/mirror" --wheel-cache "$dir/wheels" >/dev/null

gateway=$(bridge_gateway)
if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  log "serving on http://$gateway:$port/ (already running)"
  exit 0
fi
setsid "$python" -m gpuprov.artifacts serve "$dir/mirror" --bind "$gateway" --port "$port" \
  >"$dir/serve.log" 2>&1 < /dev/null &
echo $! >"$pidfile"
for _ in $(seq 1 50); do
  (exec 3<>"/dev/tcp/$gateway/$port") 2>/dev/null && break
  sleep 0.1
done
log "serving on http://$gateway:$port/"
