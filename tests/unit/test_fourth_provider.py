"""Providers named in one place (issue 55): a fourth provider, declared in the registry alone
(gpuprov.providers.spec.PROVIDERS: its package and its facts), is offered by every CLI choice
and asked by every rule that depends on a provider (the package source without --source, the
preflight's free space, prices and budgets, the image commands, the regions), without a line of
any other module edited. Its package is a throwaway one made here (FIXTURE: ``lab_provider``,
no cloud behind it); the CLI is started in a fresh process, so that its click choices are built
from the registry as a user's would be."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Registers "lab" before anything else of gpuprov reads the registry, then reports what each
# part of gpuprov offers or decides for it.
PROGRAM = r'''
import contextlib, io, json, sys, types
from dataclasses import dataclass
from gpuprov.providers import spec

package = types.ModuleType("lab_provider")
options = types.ModuleType("lab_provider.options")
exec("""
from dataclasses import dataclass
from gpuprov.providers import ProviderOptions, flag
@dataclass(frozen=True)
class LabOptions(ProviderOptions):
    region: str | None = flag("--region")
OPTIONS = LabOptions
""", options.__dict__)
package.options = options
sys.modules.update({"lab_provider": package, "lab_provider.options": options})
spec.PROVIDERS["lab"] = spec.ProviderFacts("lab_provider", images=True, regions=True, priced=True,
                                           package_source="mirror", root_free_gib=33, bake_type="lab-node")

from click.testing import CliRunner
from gpuprov.cli.app import cli
from gpuprov.ansible.inventory import group_vars
from gpuprov.pricing import cost
from gpuprov.providers import facts, get, names, options_for

def help_of(*words):
    return CliRunner().invoke(cli, [*words, "--help"], terminal_width=200).output

out = {
    "names": list(names()),
    "up": help_of("up"),
    "image list": help_of("image", "list"),
    "image bake": help_of("image", "bake"),
    "source": facts("lab").package_source,
    "free": group_vars({"known_hosts": "/k", "cluster": "c", "provider": "lab"}).get("gpu_preflight_root_free_gib"),
    "no price": cost.why_no_price("lab"),
    "options": type(options_for("lab", {"region": "lab-east-1"})).__name__,
}
try:
    get("lab")
except Exception as exc:
    out["get"] = str(exc)
print(json.dumps(out))
'''


def _lab() -> dict:
    proc = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=False, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_a_fourth_provider_declared_in_the_registry_is_offered_and_asked_everywhere() -> None:
    lab = _lab()
    assert lab["names"] == ["aws", "docker", "static", "lab"]
    assert "[aws|docker|static|lab]" in lab["up"]  # up --provider
    assert "[aws|docker|lab]" in lab["image list"] and "[aws|docker|lab]" in lab["image bake"]  # images
    assert lab["source"] == "mirror" and lab["free"] == 33
    assert lab["no price"] is None  # priced: its clusters show prices, budgets take it
    assert lab["options"] == "LabOptions"
    # Its package has no PROVIDER yet (a FIXTURE of the registry's side only): said as such.
    assert "PROVIDER" in lab["get"], lab["get"]


def test_the_registry_is_the_only_list_of_provider_names() -> None:
    """Outside gpuprov/providers/, no module compares a provider, or a node's zone, with a
    provider's name (a node taking the user's keys says so itself: gpuprov/ssh.py ``USER_KEYS``;
    `onprem`, a name a catalog entry carries as data, is no provider's)."""
    from gpuprov.providers import names

    quoted = "|".join(names())
    found = []
    for path in sorted((ROOT / "gpuprov").rglob("*.py")):
        if "providers" in path.relative_to(ROOT / "gpuprov").parts:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if any(f'{op} "{n}"' in code for op in ("==", "!=") for n in quoted.split("|")):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
            if f'Choice(["{names()[1]}"' in code or f'default="{names()[1]}"' in code:
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []
