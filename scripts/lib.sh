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

# The Debian archive URI this machine's own apt sources use (deb822 or one-line), or
# GPUPROV_DEBIAN_MIRROR; empty when none is found.
debian_mirror() {
  local mirror=${GPUPROV_DEBIAN_MIRROR:-}
  if [ -z "$mirror" ]; then
    mirror=$(grep -rhE '^URIs:' /etc/apt/sources.list.d/ 2>/dev/null \
      | awk '{print $2}' | grep -E '/debian/?$' | head -n1 || true)
  fi
  if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
    mirror=$(awk '$1=="deb" && $2 !~ /^\[/ && $2 ~ /\/debian\/?$/ {print $2; exit}' /etc/apt/sources.list)
  fi
  echo "$mirror"
}
