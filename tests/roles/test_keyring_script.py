"""The keyring writer both repository roles use (finding 6), run here with this machine's gpg.

roles/gpuprov_base/files/gpuprov-pinned-keyring.sh (the one pinned-repository task file of every role) puts exactly the
pinned key (with its own subkeys) into the Signed-By keyring, whatever else the key file
carries; tests/roles/test_repo_trust.py runs it through the roles on a node.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.fixtures import aptrepo

SCRIPT = ROOT / "roles/gpuprov_base/files/gpuprov-pinned-keyring.sh"


def primaries(keyring: Path) -> list[str]:
    out = subprocess.run(["gpg", "--batch", "--show-keys", "--with-colons", str(keyring)],
                         capture_output=True, text=True, check=True).stdout
    keys, last = [], ""
    for line in out.splitlines():
        f = line.split(":")
        if f[0] in ("pub", "sub"):
            last = f[0]
        elif f[0] == "fpr" and last == "pub":
            keys.append(f[9])
            last = ""
    return keys


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    work = tmp_path_factory.mktemp("keys")
    pinned = aptrepo.GpgKey(work / "pinned", "pinned <pinned@gpuprov.invalid>")
    # A signing subkey: repositories such as Docker's sign with one; it must stay.
    pinned._gpg("--quick-add-key", pinned.fingerprint, "ed25519", "sign", "never")
    other = aptrepo.GpgKey(work / "other", "other <other@gpuprov.invalid>")
    return work, pinned, other


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, check=False,
                          env={k: v for k, v in os.environ.items() if k != "GNUPGHOME"})


def test_one_copy_of_the_script() -> None:
    copies = sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("roles/*/files/gpuprov-pinned-keyring.sh"))
    assert copies == ["roles/gpuprov_base/files/gpuprov-pinned-keyring.sh"]


@pytest.mark.parametrize("order", ["other-first", "pinned-first"])
def test_bundled_key_file_gives_a_keyring_of_the_pinned_key_only(keys, order) -> None:
    work, pinned, other = keys
    bundle = aptrepo.export_together([other, pinned] if order == "other-first" else [pinned, other],
                                     work / f"bundle-{order}.asc")
    keyring = work / f"keyring-{order}.gpg"
    proc = run(str(bundle), pinned.fingerprint, str(keyring), "http://mirror.invalid/repo.key")
    assert proc.returncode == 0, proc.stderr
    assert primaries(keyring) == [pinned.fingerprint]
    listing = subprocess.run(["gpg", "--batch", "--show-keys", "--with-colons", str(keyring)],
                             capture_output=True, text=True, check=True).stdout
    assert sum(line.startswith("sub:") for line in listing.splitlines()) == 1, "the signing subkey was lost"
    assert "left out 1 other key" in proc.stdout


def test_key_file_without_the_pinned_key_is_refused(keys) -> None:
    work, pinned, other = keys
    keyring = work / "refused.gpg"
    proc = run(str(other.export(work / "other.asc")), pinned.fingerprint, str(keyring), "http://x.invalid/k")
    assert proc.returncode == 3 and "refusing to trust" in proc.stderr
    assert not keyring.exists()
