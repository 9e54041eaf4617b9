#!/usr/bin/env bash
# make demo's nodes: two local nodes with the whole stack, verified, with one DKMS build.
#
# Node 1 is bootstrapped from scratch (the driver's DKMS build, CUDA, cuDNN, Docker, ...), verified
# and baked into an image for its lock (`gpuprov image bake`); node 2 boots from that image and
# converges with nothing to change. A later demo finds what is there: the cluster itself (a no-op
# `up`), else the baked image (both nodes from it), else it starts from scratch.
# Each step says what it does and about how long it takes; the figures are this kind of machine's
# (docs/local.md: measured on a 2-core AMD EPYC, about 1.7 times a 2-core Intel Xeon's).
#   scripts/demo.sh [NAME]
set -euo pipefail
name=${1:-demo}
log() { printf '[demo] %s\n' "$*" >&2; }
field() { python -c "import json, sys; d = json.load(sys.stdin); print($1)"; }

started=$(date +%s)
took() { printf '%d min %02d s' $(( ($(date +%s) - $1) / 60 )) $(( ($(date +%s) - $1) % 60 )); }

nodes=0
if status=$(gpuprov status "$name" -o json 2>/dev/null); then
  nodes=$(field 'len(d["nodes"])' <<<"$status")
fi
# The image `up` would boot from: one baked for the lock, or none (JSON of a dry run: nothing made).
plan=$(gpuprov up --provider docker --count 2 --name "$name" --dry-run -o json 2>/dev/null || echo '{}')
baked=$(field '(d.get("image") or {}).get("ref") or ""' <<<"$plan")

if [ "$nodes" -ge 2 ]; then
  log "cluster $name has its $nodes nodes: up again checks each node's manifest (seconds) and verifies them unless nothing changed since their probes"
elif [ -n "$baked" ] && [ "$nodes" -eq 0 ]; then
  log "both nodes from $baked, the image baked for the lock: about 3 minutes"
else
  if [ "$nodes" -eq 0 ]; then
    t=$(date +%s)
    log "node 1 from scratch: driver 535 with its DKMS build, CUDA 11.8, cuDNN 8.9, Docker, the rest (about 12 minutes here; 7 on a 2-core Intel Xeon)"
    gpuprov up --provider docker --count 1 --name "$name" --no-baked --yes
    log "node 1 ready in $(took "$t")"
  fi
  if [ -z "$baked" ]; then
    t=$(date +%s)
    log "baking node 1 into an image for its lock, so that node 2 needs no second DKMS build (about 2 minutes)"
    gpuprov image bake --from "$name"
    log "baked in $(took "$t")"
  fi
  log "node 2 from the baked image (about 2 minutes)"
fi
t=$(date +%s)
# `up` runs the probes itself before it calls the cluster ready (none again on a cluster verified
# since its last change), and ends with one line: ready or not, and the next command.
gpuprov up --provider docker --count 2 --name "$name" --yes
log "nodes up and verified in $(took "$t"); the demo's nodes took $(took "$started")"
