#!/bin/sh
# gpuprov image bake: clean a node's file system before it is captured as an image, the way
# image builders do (Packer's and the cloud images' own clean-up steps). Runs as root, on the
# node (AWS, over SSH) or in a stopped copy of it (docker). Takes no argument and reads nothing
# from the caller: what it removes is fixed here.
#
# Removed: every SSH host key (each node gets its own at boot), cloud-init's instance state
# and logs (so the image boots as a new instance), the machine id (systemd makes a new one at
# first boot), every authorized_keys file (gpuprov writes the cluster's key at launch) and any
# registry credential, the cluster's munge key and power key and Slurm's state (a node of a
# Slurm cluster: the image must carry no cluster's secret, and a node from it joins its own
# cluster), the apt proxy a cluster's settings put there, logs, apt's package lists
# and downloaded packages, shell histories, Ansible's remote temp directories, /tmp and
# /var/tmp. Printed: one line per step, then "clean: done".
set -eu

step() { printf 'clean: %s\n' "$*"; }

step "SSH host keys"
rm -f /etc/ssh/ssh_host_*_key /etc/ssh/ssh_host_*_key.pub \
      /etc/ssh/gpuprov_host_*_key /etc/ssh/gpuprov_host_*_key.pub
# (aws) The hand-over's marker and sshd drop-in: a new instance's user-data installs its
# launch's bootstrap key only where the marker is absent, and names its own key.
rm -f /etc/gpuprov/hostkey-installed /etc/ssh/sshd_config.d/10-gpuprov-hostkey.conf

step "cloud-init instance state and logs"
if command -v cloud-init >/dev/null 2>&1; then
  cloud-init clean --logs >/dev/null 2>&1 || true
fi
rm -rf /var/lib/cloud/instances /var/lib/cloud/instance /var/lib/cloud/data /var/lib/cloud/sem
for seed in /var/lib/cloud/seed/nocloud /var/lib/cloud/seed/nocloud-net; do
  # A seed mounted from outside is not part of the disk that is captured.
  mountpoint -q "$seed" 2>/dev/null || rm -rf "$seed"
done
rm -f /var/log/cloud-init.log /var/log/cloud-init-output.log

step "machine id"
if [ -e /etc/machine-id ]; then : >/etc/machine-id; fi
rm -f /var/lib/dbus/machine-id

step "authorized keys and credentials"
for home in /root /home/*; do
  [ -d "$home" ] || continue
  rm -f "$home/.ssh/authorized_keys" "$home/.ssh/authorized_keys2" \
        "$home/.docker/config.json" "$home/.bash_history" "$home/.python_history" \
        "$home/.lesshst" "$home/.viminfo" "$home/.wget-hsts"
  rm -rf "$home/.ansible"
done
rm -f /etc/apt/apt.conf.d/01gpuprov-proxy

step "munge and Slurm keys and state"
rm -f /etc/munge/munge.key /etc/slurm/gpuprov-power.key
rm -rf /var/lib/slurm/slurmctld/* /var/lib/slurm/slurmd/* /run/slurm/conf

step "logs"
find /var/log -type f \( -name '*.gz' -o -name '*.[0-9]' -o -name '*.old' \) -delete
find /var/log -type f -exec truncate -s 0 {} +
rm -rf /var/log/journal/*

step "apt package lists and downloaded packages"
rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /var/cache/apt/*.bin
# Empty lists must look stale: the first apt task with a cache_valid_time updates them.
touch -d @0 /var/lib/apt/lists

step "temporary files"
rm -rf /tmp/* /tmp/.[!.]* /var/tmp/* /var/tmp/.[!.]* 2>/dev/null || true

step "done"
