#!/bin/bash
# gpuprov-pinned-keyring.sh KEYFILE FINGERPRINT KEYRING [ORIGIN]
#
# Write KEYRING (a binary keyring for apt's Signed-By) holding exactly one key: the
# primary key FINGERPRINT out of KEYFILE (armored or binary), with its own subkeys.
# Any other key KEYFILE carries is left out. The key is imported into a throwaway
# GNUPGHOME and exported by its full fingerprint; the result is checked to hold one
# primary key, the pinned one, before it replaces KEYRING. (Exporting "FINGERPRINT!"
# would also drop the key's own signing subkeys, which some repositories sign with.)
# Exit 3: KEYFILE lacks the pinned key; exit 4: the export is not exactly that key.
# Shared by the roles nvidia_driver and container_runtime (identical copies).
set -euo pipefail
key=$1 fpr=$2 keyring=$3 origin=${4:-$1}

primaries() {
  gpg --batch --show-keys --with-colons "$1" 2>/dev/null \
    | awk -F: '$1 == "pub" || $1 == "sub" { t = $1 } $1 == "fpr" && t == "pub" { print $10; t = "" }'
}

found=$(primaries "$key" || true)
if ! grep -qx "$fpr" <<<"$found"; then
  echo "the key at $origin has fingerprint(s) $(echo "$found" | paste -sd, -)," \
       "not the pinned $fpr: refusing to trust it" >&2
  exit 3
fi
home=$(mktemp -d /tmp/gpuprov-gnupg.XXXXXX)
trap 'gpgconf --homedir "$home" --kill all >/dev/null 2>&1 || true; rm -rf "$home"' EXIT
gpg --homedir "$home" --batch --quiet --no-autostart --import "$key" 2>/dev/null
gpg --homedir "$home" --batch --quiet --no-autostart --export "$fpr" >"$home/keyring.gpg"
got=$(primaries "$home/keyring.gpg" || true)
if [ "$got" != "$fpr" ]; then
  echo "exporting $fpr from the key at $origin gave key(s) $(echo "$got" | paste -sd, -)," \
       "not exactly the pinned one: refusing to trust it" >&2
  exit 4
fi
install -m 0644 "$home/keyring.gpg" "$keyring.gpuprov-new"
mv -f "$keyring.gpuprov-new" "$keyring"
others=$(grep -vcx "$fpr" <<<"$found" || true)
if [ "${others:-0}" -gt 0 ]; then
  echo "installed $fpr into $keyring; left out $others other key(s) the key file at $origin carries"
else
  echo "installed $fpr into $keyring"
fi
