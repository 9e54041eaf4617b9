"""The nvidia_driver role's apt preference pins the lock's release AND the chosen source's origin.

The template is rendered as the role renders it (its filters from the role's filter_plugins),
for each package source; then apt itself judges it: two local repositories (the chosen one and
another origin that carries the same release under another build, a newer release and a
newer build) and `apt-cache policy` with that preference file, nothing of the machine's own apt
state read or written.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml

from tests.fixtures import aptrepo

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "nvidia_driver"
_spec = importlib.util.spec_from_file_location("gpuprov_apt_pin", ROLE / "filter_plugins" / "gpuprov_apt_pin.py")
pin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pin)

NVIDIA_URL = "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/"


def _ere(regex: str) -> re.Pattern:
    assert regex.startswith("/") and regex.endswith("/"), regex
    # The expressions use only what POSIX ERE and Python's re share (anchors, alternation,
    # negated brackets, escaped literals); apt compiles them with REG_ICASE.
    return re.compile(regex[1:-1], re.IGNORECASE)


@pytest.mark.parametrize("text", ["Debian", "NVIDIA", "developer.download.nvidia.com", "172.17.0.1", "a"])
def test_not_string_matches_everything_but_the_string(text: str) -> None:
    rx = _ere(pin.apt_pin_not_string(text))
    assert not rx.search(text) and not rx.search(text.upper()) and not rx.search(text.lower())
    others = ["Ubuntu", "Debian Backports", "LP-PPA-graphics-drivers", "x", text[:-1], text + "x",
              "x" + text, text[1:], "nvidia.github.io", "apt.example.net"]
    for other in filter(None, others):
        if other.lower() != text.lower():
            assert rx.search(other), f"{other!r} should match the complement of {text!r}"
    # The dpkg status file has no origin: an installed version is never matched for that.
    assert not rx.search("")


def test_not_string_of_a_file_repository_is_every_named_origin() -> None:
    rx = _ere(pin.apt_pin_not_string(""))
    assert rx.search("mirror.example.org") and not rx.search("")


@pytest.mark.parametrize(("pattern", "inside", "outside"), [
    ("535.309.01-*", ["535.309.01-1", "535.309.01-0ubuntu0.22.04.1", "535.309.01-"],
     ["535.309.011-1", "535.309.0-1", "535.309.01", "535.309", "580.95.05-1", "1:535.309.01-1", "535x309.01-1"]),
    ("11.8.89*", ["11.8.89", "11.8.89~11.8.0-5~deb12u1"], ["11.8.8", "11.8.0-1", "12.8.89"]),
    ("535.261.03-1", ["535.261.03-1"], ["535.261.03-10", "535.261.03-", "535.261.03"]),
])
def test_not_version_is_the_complement_of_apts_version_pin(pattern, inside, outside) -> None:
    rx = _ere(pin.apt_pin_not_version(pattern))
    for version in inside:
        assert not rx.search(version), f"{version} is {pattern}: the 'other versions' record must skip it"
    for version in outside:
        assert rx.search(version), f"{version} is not {pattern}: the 'other versions' record must take it"


@pytest.mark.parametrize("bad", ["", "535*309", "5,3", "535 309", "*", "[5]*"])
def test_patterns_the_preference_cannot_express_are_refused(bad: str) -> None:
    with pytest.raises(pin.AptPinError):
        pin.apt_pin_not_version(bad)


@pytest.mark.parametrize(("url", "host"), [
    (NVIDIA_URL, "developer.download.nvidia.com"),
    ("http://172.17.0.1:8080/nvidia/", "172.17.0.1"),
    ("https://user:pw@Mirror.Example.internal/cuda/", "mirror.example.internal"),
    ("file:///srv/repo/", ""),
])
def test_origin_host_is_what_apt_compares(url: str, host: str) -> None:
    assert pin.apt_origin_host(url) == host


def test_a_url_without_a_host_is_refused() -> None:
    with pytest.raises(pin.AptPinError):
        pin.apt_origin_host("https:///x/")


def _render(source: str, repo_url: str, version: str = "535.309.01-*", distribution: str = "Debian") -> str:
    """The preference as the role writes it: the role's vars and the template, its filters."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True)
    env.filters.update(pin.FilterModule().filters())
    env.filters["regex_escape"] = re.escape
    role_vars = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    ctx = {
        "ansible_managed": "Managed by gpuprov",
        "ansible_facts": {"distribution": distribution},
        "nvidia_driver_source": source,
        "nvidia_driver_package_version": version,
        "nvidia_driver_repo_url": repo_url,
        "nvidia_driver_mirror_url": repo_url,
        "nvidia_driver_mirror_key_url": "", "nvidia_driver_repo_key_url": "",
        "nvidia_driver_mirror_key_fingerprint": "", "nvidia_driver_repo_key_fingerprint": "",
    }
    for name in ("__nvidia_driver_repo", "__nvidia_driver_pin_packages", "__nvidia_driver_pin_origin",
                 "__nvidia_driver_pin_source"):
        ctx[name] = env.from_string(str(role_vars[name])).render(ctx)
    return env.from_string((ROLE / "templates" / "gpuprov-nvidia-driver.pref.j2").read_text()).render(ctx)


def _records(text: str) -> list[dict[str, str]]:
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    return [dict(line.split(": ", 1) for line in block.strip().splitlines())
            for block in re.split(r"\n\s*\n", body) if block.strip()]


@pytest.mark.parametrize(("source", "url", "pin_line"), [
    ("nvidia", NVIDIA_URL, "origin /"),
    ("mirror", "http://mirror.example.internal/cuda/", "origin /"),
    ("distro", "", "release o=/"),
])
def test_rendered_preference_has_three_records_in_order(source: str, url: str, pin_line: str) -> None:
    records = _records(_render(source, url))
    assert [set(r) for r in records] == [{"Package", "Pin", "Pin-Priority"}] * 3
    assert [r["Pin-Priority"] for r in records] == ["500", "-1", "1001"]
    assert records[0]["Pin"].startswith("version /^(")
    assert records[1]["Pin"].startswith(pin_line)
    assert records[2]["Pin"] == "version 535.309.01-*"
    assert {r["Package"] for r in records} == {"*nvidia* libcuda* libnvcuvid* libnvoptix*"}
    chosen = {"nvidia": "developer.download.nvidia.com", "mirror": "mirror.example.internal",
              "distro": "Debian"}[source]
    other = _ere(records[1]["Pin"].split(" ", 1)[1].removeprefix("o="))
    assert not other.search(chosen) and other.search("apt.example.net") and other.search("Ubuntu")


def test_the_packages_are_named_by_globs_that_match_what_the_role_holds() -> None:
    """Globs, not regular expressions (apt matches them against every package name it knows,
    whenever it builds its policy: regular expressions cost about five times as much). They
    select every name that holds "nvidia" and NVIDIA's libcuda, libnvcuvid, libnvoptix, nothing
    else (fnmatch(3), as apt matches them)."""
    globs = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__nvidia_driver_pin_packages"].split()
    assert not [g for g in globs if g.startswith("/")]
    names = ["nvidia-driver", "libnvidia-ml1", "firmware-nvidia-gsp", "libcuda1", "libcudart12",
             "libnvcuvid1", "libnvoptix1", "xserver-xorg-video-nvidia", "cuda-toolkit-12-4", "libcudnn8",
             "python3-pycuda", "libnccl2", "xnvidiax", "libnvidia-container1", "nvidia-container-toolkit"]
    assert [n for n in names if any(fnmatch.fnmatchcase(n, g) for g in globs)] == [
        "nvidia-driver", "libnvidia-ml1", "firmware-nvidia-gsp", "libcuda1", "libcudart12", "libnvcuvid1",
        "libnvoptix1", "xserver-xorg-video-nvidia", "xnvidiax", "libnvidia-container1", "nvidia-container-toolkit"]


# --- apt itself judges the preference ----------------------------------------------------------

_TOOLS = ("apt-get", "apt-cache", "apt-ftparchive", "dpkg-deb", "dpkg-scanpackages")


def _flat_repo(root: Path, origin: str, packages: list[aptrepo.FakePackage]) -> Path:
    """An unsigned flat repository whose Release file names ``origin`` (read with trusted=yes)."""
    root.mkdir(parents=True)
    for pkg in packages:
        aptrepo.build_deb(pkg, root)
    (root / "Packages").write_text(subprocess.run(
        ["dpkg-scanpackages", "--multiversion", "."], cwd=root, capture_output=True, text=True,
        check=True).stdout)
    (root / "Release").write_text(subprocess.run(
        ["apt-ftparchive", "-o", f"APT::FTPArchive::Release::Origin={origin}", "release", "."],
        cwd=root, capture_output=True, text=True, check=True).stdout)
    return root


def _policy(tmp: Path, urls: list[str], pref: str, packages: list[str]) -> dict[str, dict[str, str]]:
    """{package: {version: priority}} and the candidate, as `apt-cache policy` reports them."""
    state = tmp / "apt"
    for sub in ("lists/partial", "cache/archives/partial"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    (state / "sources.list").write_text("".join(f"deb [trusted=yes] {u} /\n" for u in urls))
    (state / "pref").write_text(pref)
    opts = ["-o", f"Dir::State::Lists={state}/lists", "-o", f"Dir::Etc::SourceList={state}/sources.list",
            "-o", "Dir::Etc::SourceParts=/dev/null", "-o", f"Dir::Cache={state}/cache",
            "-o", f"Dir::Etc::preferences={state}/pref", "-o", "Dir::Etc::PreferencesParts=/dev/null",
            "-o", "Dir::State::status=/dev/null", "-o", "APT::Default-Release="]
    subprocess.run(["apt-get", *opts, "update"], check=True, capture_output=True, text=True)
    out = subprocess.run(["apt-cache", *opts, "policy", *packages], check=True, capture_output=True,
                         text=True).stdout
    result: dict[str, dict[str, str]] = {}
    for block in re.split(r"(?m)^(?=\S)", out):
        if not block.strip():
            continue
        name = block.split(":", 1)[0]
        table = dict(re.findall(r"(?m)^ {5}(?:\*\*\* )?(\S+) (-?\d+)$", block))
        table["candidate"] = re.search(r"Candidate: (\S+)", block).group(1)
        result[name] = table
    return result


@pytest.fixture
def two_origins(tmp_path: Path):
    if missing := [t for t in _TOOLS if shutil.which(t) is None]:
        pytest.skip(f"needs {', '.join(missing)} (Debian's apt and dpkg-dev)")
    driver = "nvidia-driver-535"
    chosen = _flat_repo(tmp_path / "chosen", "NVIDIA", [
        aptrepo.FakePackage(driver, "535.309.01-1", {"/x": "chosen"}),
        aptrepo.FakePackage(driver, "535.400.01-1", {"/x": "chosen newer release"}),
        aptrepo.FakePackage("nvidia-container-toolkit", "1.17.8-1", {"/y": "toolkit"}),
    ])
    # Another origin with the lock's release in another (higher) build, as Ubuntu's archive
    # carries 535.309.01-0ubuntu0.22.04.1 beside NVIDIA's -0ubuntu1: without the origin pin
    # apt takes this one.
    other = _flat_repo(tmp_path / "other", "Ubuntu", [
        aptrepo.FakePackage(driver, "535.309.01-9ubuntu0.22.04.1", {"/x": "other build"}),
        aptrepo.FakePackage(driver, "580.95.05-0ubuntu1", {"/x": "other branch"}),
    ])
    servers = [aptrepo.Server(chosen, "127.0.0.1"), aptrepo.Server(other, "127.0.0.2")]
    yield servers[0].url, servers[1].url
    for server in servers:
        server.close()


@pytest.mark.parametrize("source", ["nvidia", "mirror"])
def test_apt_takes_the_locks_release_only_from_the_chosen_host(tmp_path, two_origins, source) -> None:
    chosen, other = two_origins
    pref = _render(source, chosen)
    got = _policy(tmp_path, [chosen, other], pref, ["nvidia-driver-535", "nvidia-container-toolkit"])
    driver = got["nvidia-driver-535"]
    assert driver["candidate"] == "535.309.01-1", driver
    assert driver["535.309.01-1"] == "1001"
    assert driver["535.309.01-9ubuntu0.22.04.1"] == "-1"
    assert driver["535.400.01-1"] == "500" and driver["580.95.05-0ubuntu1"] == "500"
    # A package with no release of the driver's version is installable as before.
    assert got["nvidia-container-toolkit"]["candidate"] == "1.17.8-1"


def test_without_the_origin_pin_apt_would_take_the_other_build(tmp_path, two_origins) -> None:
    """The failure the origin records prevent: the version record alone picks the other build."""
    chosen, other = two_origins
    version_only = "\n\n".join(
        block for block in _render("nvidia", chosen).split("\n\n") if "Pin: version 535.309.01-*" in block)
    got = _policy(tmp_path, [chosen, other], version_only, ["nvidia-driver-535"])
    assert got["nvidia-driver-535"]["candidate"] == "535.309.01-9ubuntu0.22.04.1"


def test_distro_source_takes_the_release_only_from_debian(tmp_path, two_origins) -> None:
    # Here the "other" repository plays the distribution: its Origin is Ubuntu (as Debian's is
    # Debian), and the node's distribution is named after it.
    chosen, other = two_origins
    pref = _render("distro", "", version="535.309.01-*", distribution="Ubuntu")
    got = _policy(tmp_path, [chosen, other], pref, ["nvidia-driver-535"])["nvidia-driver-535"]
    assert got["candidate"] == "535.309.01-9ubuntu0.22.04.1", got
    assert got["535.309.01-1"] == "-1"
