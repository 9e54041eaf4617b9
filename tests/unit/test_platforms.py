"""Every place that lists a platform says which are proven here: the roles' meta/main.yml and
READMEs, docs/aws.md and the README, `gpuprov stack`, all against gpuprov/platforms.py; and "proven" means
what the molecule configuration runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpuprov import platforms

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "meta" / "main.yml").is_file())


def test_proven_is_what_molecule_runs() -> None:
    config = yaml.safe_load((ROOT / ".config" / "molecule" / "config.yml").read_text())
    images = {p["image"] for p in config["platforms"]}
    assert images == {"${GPUPROV_MOLECULE_IMAGE:-gpuprov/node:bookworm}"}
    from tests.molecule.scenarios import MATRIX, OS_IMAGES, SCENARIOS

    assert OS_IMAGES == {"debian12": "gpuprov/node:bookworm", "debian13": "gpuprov/node:trixie"}
    assert [(r, s) for r, s, os_name in MATRIX if os_name == "debian12"] == SCENARIOS
    assert sorted({r for r, _, os_name in MATRIX if os_name == "debian13"}) == list(platforms.DEBIAN13_MOLECULE)
    # Proven everywhere (every role, every play): what molecule runs.
    assert [p.key for p in platforms.PLATFORMS if p.proven and not p.where] == ["debian12"]


def test_debian13_is_proven_by_its_end_to_end_test_for_what_it_runs() -> None:
    """Debian 13 is proven for the plays its one end-to-end file runs on a trixie node, and the
    roles whose meta/main.yml names trixie are exactly those plays' roles."""
    trixie = platforms.get("debian13")
    assert trixie.proven
    assert trixie.where == ("local nodes: the whole site of --source distro; the molecule scenarios of the "
                            "container_runtime, gpu_preflight, microcode, monitoring, node_patch, rdma, slurm and "
                            "spot_interruption roles")
    test = (ROOT / platforms.DEBIAN13_TEST).read_text()
    assert '"--os", "debian13"' in test and '"--tags"' not in test  # the whole site
    named = {role for role in ROLES if ("Debian", "trixie") in {
        (p["name"], v) for p in yaml.safe_load((ROOT / "roles" / role / "meta" / "main.yml").read_text())
        ["galaxy_info"]["platforms"] for v in p["versions"]}}
    assert named == {"gpuprov_base", "gpuprov_lock", "gpu_preflight", "nvidia_driver", "cuda", "cudnn"} | set(
        platforms.DEBIAN13_MOLECULE)


@pytest.mark.parametrize("role", ROLES)
def test_role_meta_names_only_known_platforms_and_says_which_are_proven(role: str) -> None:
    text = (ROOT / "roles" / role / "meta" / "main.yml").read_text()
    named = yaml.safe_load(text)["galaxy_info"]["platforms"]
    unknown = [(p["name"], v) for p in named for v in p["versions"] if (p["name"], v) not in platforms.BY_CODENAME]
    assert unknown == [], f"roles/{role}/meta/main.yml names platforms gpuprov/platforms.py lacks"
    assert ("Debian", "bookworm") in {(p["name"], v) for p in named for v in p["versions"]}
    before = text.split("  platforms:")[0]
    assert "claimed, not proven here" in before
    flat = " ".join(line.strip(" #") for line in before.splitlines())
    if ("Debian", "trixie") in {(p["name"], v) for p in named for v in p["versions"]}:
        assert ("Proven here: Debian bookworm (this role's molecule scenario" in before
                and f"and trixie ({platforms.DEBIAN13_TEST} runs this role's play" in flat) or (
            role in platforms.DEBIAN13_MOLECULE and "Proven here: Debian bookworm and trixie (this role's molecule "
            "scenario runs on the node images gpuprov/node:bookworm and gpuprov/node:trixie" in flat)
    else:
        assert "Proven here: Debian bookworm only" in before


@pytest.mark.parametrize("role", ROLES)
def test_role_readme_lists_the_metas_platforms_as_proven_or_claimed(role: str) -> None:
    base = ROOT / "roles" / role
    named = yaml.safe_load((base / "meta" / "main.yml").read_text())["galaxy_info"]["platforms"]
    section = (base / "README.md").read_text().split("## Platforms", 1)[1].split("\n## ", 1)[0]
    assert "Proven here on Debian 12 (bookworm)" in section
    if any(p["name"] == "Debian" and "trixie" in p["versions"] for p in named):
        assert ("Proven here on Debian 13 (trixie) too, on a local node" in " ".join(section.split())
                and f"`{platforms.DEBIAN13_TEST}`" in section) or (
            role in platforms.DEBIAN13_MOLECULE and "Proven here on Debian 13 (trixie) too: the same scenario runs "
            "on the node image `gpuprov/node:trixie`" in " ".join(section.split()))
    for p in named:
        for codename in p["versions"]:
            platform = platforms.BY_CODENAME[(p["name"], codename)]
            if not platform.proven:
                assert f"{platform.version} ({codename})" in section, (role, codename)
    assert "is claimed by `meta/main.yml`, not proven" in section or all(
        platforms.BY_CODENAME[(p["name"], v)].proven for p in named for v in p["versions"])


def test_aws_doc_platforms_paragraph() -> None:
    doc = (ROOT / "docs" / "aws.md").read_text()
    paragraph = doc.split("**Platforms.**", 1)[1].split("\n\n", 1)[0]
    assert "proven here on Debian 12 (bookworm)" in paragraph and "on Debian 12 only" in paragraph
    assert "`--os ubuntu22.04`" in paragraph and "not proven here" in paragraph
    assert "/aws/service/debian/release/12/latest/amd64" in paragraph
    assert "/aws/service/debian/release/13/latest/amd64" in paragraph and "`--os debian13`" in paragraph
    # Ubuntu 24.04: Canonical's noble parameter, the one preflight reads, and "claimed, not proven here".
    words = " ".join(paragraph.split())
    assert "`--os ubuntu24.04` launches Canonical's Ubuntu 24.04 (noble), claimed, not proven here" in words
    from gpuprov.providers.aws import preflight

    assert f"`{preflight.IMAGE_SOURCES['ubuntu24.04'][0].format(arch='amd64')}`" in paragraph


def test_readme_platforms_section() -> None:
    section = (ROOT / "README.md").read_text().split("## Platforms\n", 1)[1].split("\n## ", 1)[0]
    words = " ".join(section.split())
    assert "Every role is proven here on Debian 12 (bookworm)" in words
    assert "`--os ubuntu22.04`" in words and "not proven here" in words
    assert ("`gpuprov stack --os ubuntu24.04` resolves a lock of NVIDIA's ubuntu2404 repository names (R580, "
            "CUDA 12.9 or 13.0), read off NVIDIA's public documents: claimed, not proven here") in words
    assert ("Debian 13 (trixie) is proven here with `--source distro`: `gpuprov up --provider docker --os debian13 "
            "--source distro` installs the whole site from trixie's own archive") in words


def test_stack_shows_the_platforms(capsys) -> None:
    from gpuprov.cli.app import main

    with pytest.raises(SystemExit) as exc:
        main(["stack", "--type", "g5.xlarge", "-o", "json"])
    out, _ = capsys.readouterr()
    assert exc.value.code in (0, None)
    rows = json.loads(out)["platforms"]
    assert rows[0] == {"os": "debian12", "name": "Debian 12 (bookworm)", "proven": True,
                       "how": platforms.PROVEN_BY, "slurm": "22.05.8"}
    assert rows[1] == {"os": "debian13", "name": "Debian 13 (trixie)", "proven": True,
                       "how": platforms.PROVEN_BY_DEBIAN13, "slurm": "24.11.5"}
    assert {r["os"]: r["proven"] for r in rows[2:]} == {"ubuntu20.04": False, "ubuntu22.04": False, "ubuntu24.04": False}
    # Only a run proves a platform: Ubuntu 24.04 is a lock OS now, and still claimed.
    assert rows[4] == {"os": "ubuntu24.04", "name": "Ubuntu 24.04 (noble)", "proven": False,
                       "how": platforms.CLAIMED, "slurm": "23.11.4"}

    with pytest.raises(SystemExit):
        main(["stack", "--type", "g5.xlarge"])
    out, _ = capsys.readouterr()
    assert ("proven here: Debian 12 (bookworm), Debian 13 (trixie) (local nodes: the whole "
            "site of --source distro; the molecule scenarios of the container_runtime, gpu_preflight, "
            "microcode, monitoring, node_patch, rdma, slurm and spot_interruption roles); claimed, not"
            ) in " ".join(out.replace("\u2502", " ").split())  # the table's borders where a cell wraps
    assert "the OS's own slurm-wlm): Debian 12 22.05.8, Debian 13 24.11.5, Ubuntu 20.04 19.05.5" in " ".join(out.split())
