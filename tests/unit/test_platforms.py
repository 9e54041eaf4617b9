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
    assert images == {"gpuprov/node:bookworm"}
    assert [p.key for p in platforms.PLATFORMS if p.proven] == ["debian12"]


@pytest.mark.parametrize("role", ROLES)
def test_role_meta_names_only_known_platforms_and_says_which_are_proven(role: str) -> None:
    text = (ROOT / "roles" / role / "meta" / "main.yml").read_text()
    named = yaml.safe_load(text)["galaxy_info"]["platforms"]
    unknown = [(p["name"], v) for p in named for v in p["versions"] if (p["name"], v) not in platforms.BY_CODENAME]
    assert unknown == [], f"roles/{role}/meta/main.yml names platforms gpuprov/platforms.py lacks"
    assert ("Debian", "bookworm") in {(p["name"], v) for p in named for v in p["versions"]}
    before = text.split("  platforms:")[0]
    assert "Proven here: Debian bookworm only" in before and "claimed, not proven here" in before


@pytest.mark.parametrize("role", ROLES)
def test_role_readme_lists_the_metas_platforms_as_proven_or_claimed(role: str) -> None:
    base = ROOT / "roles" / role
    named = yaml.safe_load((base / "meta" / "main.yml").read_text())["galaxy_info"]["platforms"]
    section = (base / "README.md").read_text().split("## Platforms", 1)[1].split("\n## ", 1)[0]
    assert "Proven here on Debian 12 (bookworm)" in section
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
    assert "proven here on Debian 12 (bookworm) only" in paragraph
    assert "`--os ubuntu22.04`" in paragraph and "not proven here" in paragraph
    assert "/aws/service/debian/release/12/latest/amd64" in paragraph
    assert "/aws/service/debian/release/13/latest/amd64" in paragraph and "`--os debian13`" in paragraph


def test_readme_platforms_section() -> None:
    section = (ROOT / "README.md").read_text().split("## Platforms\n", 1)[1].split("\n## ", 1)[0]
    words = " ".join(section.split())
    assert "proven here on Debian 12 (bookworm) only" in words
    assert "`--os ubuntu22.04`" in words and "not proven here" in words
    assert "Debian 13 (trixie) is claimed, not proven" in words


def test_stack_shows_the_platforms(capsys) -> None:
    from gpuprov.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["stack", "--type", "g5.xlarge", "-o", "json"])
    out, _ = capsys.readouterr()
    assert exc.value.code in (0, None)
    rows = json.loads(out)["platforms"]
    assert rows[0] == {"os": "debian12", "name": "Debian 12 (bookworm)", "proven": True,
                       "how": platforms.PROVEN_BY, "slurm": "22.05.8"}
    assert {r["os"]: r["proven"] for r in rows[1:]} == {
        "debian13": False, "ubuntu20.04": False, "ubuntu22.04": False, "ubuntu24.04": False}

    with pytest.raises(SystemExit):
        main(["stack", "--type", "g5.xlarge"])
    out, _ = capsys.readouterr()
    assert "proven here: Debian 12 (bookworm); claimed, not proven here: Debian 13 (trixie), Ubuntu 20.04" in " ".join(out.split())
    assert "the OS's own slurm-wlm): Debian 12 22.05.8, Debian 13 24.11.5, Ubuntu 20.04 19.05.5" in " ".join(out.split())
