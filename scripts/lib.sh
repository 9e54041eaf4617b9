# Shared helpers for gpuprov's scripts (sourced).

# The docker bridge's gateway address: where local nodes reach this machine.
bridge_gateway() {
  local gw
  gw=$(docker network inspect bridge -f '{{range .IPAM.Config}}{{.Gateway}}{{end}}' 2>/dev/null || true)
  if [ -z "$gw" ]; then
    gw=$(ip -4 -o addr show docker0 2>/dev/null | awk '{split($4, a, "/"); print a[1]; exit}')
  fi
  echo "${gw:-172.17.0.1}"
}

# A hash of the node image's recipe: the image is rebuilt when it changes.
recipe_hash() {
  sha256sum "$(dirname "${BASH_SOURCE[0]}")/build-node-image.sh" | cut -c1-16
}
