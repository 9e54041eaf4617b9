#!/bin/bash
# gpuprov node_patch kernel guard: which kernel this node boots next, whether an NVIDIA
# module is built for it, and whether the driver packages (the arguments) are installed.
# Prints key=value lines: next, running, module (yes/no, when a next kernel is known), driver.
set -o pipefail
# The newest installed kernel image is what the boot loader picks; a node with only headers
# (a container) is judged by its newest headers.
newest() {
  dpkg-query -W -f='${Status}\t${Package}\n' "$1" 2>/dev/null \
    | awk -F'\t' '$1 ~ / installed$/ && $2 !~ /-common$/ { print $2 }' \
    | sed "s/^$2//" | sort -V | tail -1
}
next=$(newest 'linux-image-[0-9]*' linux-image-)
[ -n "$next" ] || next=$(newest 'linux-headers-[0-9]*' linux-headers-)
echo "next=$next"
echo "running=$(uname -r)"
if [ -n "$next" ]; then
  if dkms status -k "$next" 2>/dev/null | grep -Eq '^nvidia[^,]*, [^:]*: installed' \
     || find "/lib/modules/$next" -name 'nvidia.ko*' 2>/dev/null | grep -q .; then
    echo "module=yes"
  else
    echo "module=no"
  fi
fi
if [ "$#" -gt 0 ] && dpkg-query -W -f='${Status}\n' "$@" 2>/dev/null | grep -q ' installed$'; then
  echo "driver=yes"
else
  echo "driver=no"
fi
