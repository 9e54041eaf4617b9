#!/usr/bin/env bash
# The local artifact mirror, as an air-gapped site would run one: build the
# artifacts gpuprov installs from archives (the cuDNN redist archives and CUDA
# 13.0's redist archives, rebuilt reproducibly from the pinned PyPI wheels and
# checked against the lock's sha256s), then serve them over HTTP on the docker bridge gateway, where the
# local nodes reach it. Idempotent: builds only what is missing, starts only
# when not running.
#   scripts/artifact-mirror.sh [start|build|wait|stop]
#     build  start building what is missing, in the background (no Docker needed: make demo and
#            make test start it first, so that it runs beside the host's set-up and the first node)
#     start  build (when not running) and serve; a request for an artifact still being built is
#            held until it is there (gpuprov/artifacts.py)
#     wait   until the build in the background ends; its log when it failed
# GPUPROV_MIRROR_LINES: the CUDA lines whose artifacts to build ("all", the default; "default",
# the demo's lock: 11.8's cuDNN 8.9 alone; or "11.8,13.0"). What is built stays: a later build
# of all lines adds the rest.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON_BIN:-$here/.venv/bin/python}
dir=${GPUPROV_ARTIFACTS:-/var/cache/gpuprov-artifacts}
port=${GPUPROV_ARTIFACT_PORT:-8089}
lines=${GPUPROV_MIRROR_LINES:-all}
pidfile=$dir/serve.pid
log() { printf '[artifact-mirror] %s\n' "$*" >&2; }
building() { "$python" -c 'import sys; from pathlib import Path; from gpuprov.artifacts import building; sys.exit(0 if building(Path(sys.argv[1])) else 1)' "$dir/mirror"; }

build() {
  mkdir -p "$dir/mirror"
  if building; then
    log "a build is already running in the background (log: $dir/build.log)"
    return 0
  fi
  if [ "$lines" = all ]; then
    what="every line's artifacts (first time: the cuDNN 8.9 wheel, ~700 MB, a plain tar: about 15 seconds; CUDA 13.0's wheels, ~650 MB, and cuDNN 9's for CUDA 12, ~700 MB, as plain tars: about a minute)"
  else
    what="the artifacts of CUDA line(s) $lines (first time: the cuDNN 8.9 wheel, ~700 MB, a plain tar: about 15 seconds)"
  fi
  said=$("$python" -m gpuprov.artifacts build "$dir/mirror" --wheel-cache "$dir/wheels" --lines "$lines" \
    --background "$dir/build.log")
  if [ "$said" = "nothing to build" ]; then
    log "artifacts present in $dir/mirror"
  else
    log "building $what, in the background: $said"
  fi
}

case "${1:-start}" in
  stop)
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
    exit 0 ;;
  build)
    build
    exit 0 ;;
  wait)
    while building; do sleep 5; done
    if ! "$python" -m gpuprov.artifacts build "$dir/mirror" --wheel-cache "$dir/wheels" --lines "$lines" >/dev/null; then
      log "the artifacts are not the pinned ones; see $dir/build.log"
      exit 1
    fi
    log "artifacts built in $dir/mirror"
    exit 0 ;;
  start) ;;
  *) log "usage: $0 [start|build|wait|stop]"; exit 2 ;;
esac

build
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
