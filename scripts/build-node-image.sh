#!/usr/bin/env bash
# Build the local node image: a systemd Debian 12 root filesystem made with
# debootstrap from the distribution archive this machine already uses, then
# imported into Docker. No image registry is needed.
#
# The image is deliberately close to a cloud image: systemd as PID 1, an SSH
# server, python3, sudo, unattended-upgrades, a non-root admin user
# (`gpuprov`, passwordless sudo). It carries NO SSH host keys: gpuprov
# generates each node's host keys itself and pins them before first contact.
set -euo pipefail

image=${1:-${GPUPROV_NODE_IMAGE:-gpuprov/node:bookworm}}
suite=${GPUPROV_NODE_SUITE:-bookworm}

log() { printf '[node-image] %s\n' "$*" >&2; }
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

mirror=$(debian_mirror)
if [ -z "$mirror" ]; then
  log "cannot find a Debian mirror in this machine's apt sources; set GPUPROV_DEBIAN_MIRROR"
  exit 1
fi

rootfs=$(mktemp -d /var/tmp/gpuprov-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT

packages=systemd,systemd-sysv,dbus,python3,python3-apt,sudo,ca-certificates,gnupg,iproute2,openssh-server,pciutils,kmod,unattended-upgrades,procps,psmisc,lsb-release,less
log "debootstrap $suite from $mirror (about a minute)"
debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" >/var/tmp/gpuprov-debootstrap.log 2>&1 || {
  log "debootstrap failed; see /var/tmp/gpuprov-debootstrap.log"
  exit 1
}

# apt sources: main plus contrib/non-free (NVIDIA's packages live in non-free).
cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $mirror $suite main contrib non-free non-free-firmware
deb $mirror $suite-updates main contrib non-free non-free-firmware
EOF
security=${mirror%/debian*}/debian-security
if grep -rqs 'debian-security' /etc/apt/sources.list.d/ /etc/apt/sources.list; then
  echo "deb $security $suite-security main contrib non-free non-free-firmware" >>"$rootfs/etc/apt/sources.list"
fi

chroot "$rootfs" /bin/sh -eu <<'EOF'
# No host keys in the image: every node gets its own, made by gpuprov.
rm -f /etc/ssh/ssh_host_*
# Host keys are injected before boot; never regenerate them at start.
systemctl disable ssh.socket >/dev/null 2>&1 || true
systemctl enable ssh.service >/dev/null 2>&1
# Units that make no sense in a container node.
for unit in getty@tty1.service systemd-remount-fs.service systemd-firstboot.service \
            apt-daily.timer apt-daily-upgrade.timer; do
  systemctl mask "$unit" >/dev/null 2>&1 || true
done
useradd --create-home --shell /bin/bash gpuprov
echo 'gpuprov ALL=(ALL) NOPASSWD:ALL' >/etc/sudoers.d/gpuprov
chmod 0440 /etc/sudoers.d/gpuprov
install -d -m 0700 -o gpuprov -g gpuprov /home/gpuprov/.ssh
# The same SSH server hardening a cloud image ships with.
cat >/etc/ssh/sshd_config.d/10-gpuprov.conf <<'CONF'
HostKey /etc/ssh/ssh_host_ed25519_key
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
CONF
: >/etc/machine-id
apt-get clean
rm -rf /var/lib/apt/lists/*
# Empty lists must look stale, so the first `apt update_cache` with a
# cache_valid_time really updates.
touch -d @0 /var/lib/apt/lists
EOF

log "importing $image"
tar -C "$rootfs" -c . | docker import \
  -c 'CMD ["/sbin/init"]' \
  -c 'ENV container=docker' \
  -c 'LABEL org.opencontainers.image.title=gpuprov-node' \
  -c "LABEL gpuprov.image-recipe=$(recipe_hash)" \
  - "$image" >/dev/null
log "built $image"
