"""The `--output json` shapes: docs/json-output.md against the result dataclasses, both ways.

Each command's section in the document has one table, a row per field: its path
(``nodes[].name``: a field of each element of ``nodes``; ``hosts.<node>.ok``: a field of the
object under each node's name), its type and its meaning. The same rows are derived here from
the dataclasses of gpuprov/core/results.py; a field in code and not in the document fails, and
so does a documented field the code does not have, or a type that differs.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from typing import Any

import pytest

from gpuprov.results import costs
from gpuprov.results import shapes as results
from gpuprov.results.shapes import SHAPES, serialise
from tests.json_doc import DOC, _normal, _paths, documented

SCALARS = {str: "string", int: "integer", bool: "boolean", float: "number"}
TYPE_GRAMMAR = re.compile(r"(optional )?((array|map) of )*(string|integer|number|boolean|object)( or null)?")


# -- the code ---------------------------------------------------------------------------------------
def render(tp: Any) -> tuple[str, list[tuple[str, type]]]:
    """A type's words in the document, and the dataclasses inside it with their path suffixes."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        assert len(inner) == 1, tp
        text, inside = render(inner[0])
        return f"{text} or null", inside
    if dataclasses.is_dataclass(tp):
        return "object", [("", tp)]  # type: ignore[list-item]
    if typing.is_typeddict(tp):
        return "object", []  # a stored record (the lock): its keys are documented with the lock
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (list, tuple):
        text, inside = render(args[0])
        return f"array of {text}", [("[]" + s, d) for s, d in inside]
    if origin is dict:
        if args[1] is Any:
            return "object", []  # free-form: its meaning says what it holds
        text, inside = render(args[1])
        return f"map of {text}", [(".<>" + s, d) for s, d in inside]
    assert tp in SCALARS, f"no JSON type for {tp!r}"
    return SCALARS[tp], []


def rows_of(cls: type, path: str, out: dict[str, str]) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        name = results.json_name(f)
        here = f"{path}.{name}" if path else name
        text, inside = render(hints[f.name])
        if f.metadata.get(results.OPTIONAL):
            # Left out while None: never null in the JSON.
            text = "optional " + text.removesuffix(" or null")
        out[here] = text
        for suffix, sub in inside:
            rows_of(sub, here + suffix, out)


def in_code(command: str) -> dict[str, str]:
    out: dict[str, str] = {}
    _, inside = render(SHAPES[command])
    for suffix, cls in inside:
        rows_of(cls, suffix, out)
    return out


# -- the tests ----------------------------------------------------------------------------------------
def test_every_command_with_a_result_has_a_section_and_no_section_is_unknown() -> None:
    doc = documented()
    assert set(SHAPES) <= set(doc), f"undocumented: {sorted(set(SHAPES) - set(doc))}"
    assert set(doc) - set(SHAPES) == set(PLAIN), "a section for a command that prints no JSON"


def test_types_follow_the_documents_grammar() -> None:
    bad = {(cmd, path, t) for cmd, rows in documented().items() for path, t in rows.items()
           if not TYPE_GRAMMAR.fullmatch(t)}
    assert bad == set()


@pytest.mark.parametrize("command", sorted(SHAPES))
def test_fields_in_code_are_documented(command: str) -> None:
    doc, code = documented()[command], in_code(command)
    assert {p: t for p, t in code.items() if p not in doc} == {}, f"{command}: not in {DOC.name}"


@pytest.mark.parametrize("command", sorted(SHAPES))
def test_documented_fields_are_in_code(command: str) -> None:
    doc, code = documented()[command], in_code(command)
    assert {p: t for p, t in doc.items() if p not in code} == {}, f"{command}: documented, not in code"


@pytest.mark.parametrize("command", sorted(SHAPES))
def test_documented_types_are_the_codes(command: str) -> None:
    doc, code = documented()[command], in_code(command)
    assert {p: (doc[p], t) for p, t in code.items() if p in doc and doc[p] != t} == {}


# -- commands whose JSON is plain data (not a result dataclass): checked on a real result ---------
def _stack() -> dict[str, Any]:
    from gpuprov.lock import stack

    return stack.resolve("p4d.24xlarge").public()  # type: ignore[no-any-return]


def _types() -> dict[str, Any]:
    from gpuprov import catalog
    from gpuprov.cli.stack import offer_row
    from gpuprov.pricing import select

    found, _ = select.offers([catalog.get("p4d.24xlarge")], "us-east-1", select.Need(gpus=8))
    return offer_row(found[0])


def _image() -> dict[str, Any]:
    from gpuprov.images import LOCK_FIELDS, BakedImage

    return BakedImage(id="ami-0123456789abcdef0", ref="ami-0123456789abcdef0", provider="aws",
                      lock_hash="0123456789ab", created="2026-11-25T10:00:00Z", source="demo/demo-node-1",
                      lock=dict.fromkeys(LOCK_FIELDS, "x"), region="us-east-1", size_gib=200.0,
                      os="debian12").public()


PLAIN = {"stack": _stack, "types": _types, "image": _image}


@pytest.mark.parametrize("command", sorted(PLAIN))
def test_plain_shapes_match_a_real_result(command: str) -> None:
    """`types` prints an array of these rows, `stack` one: the fields by name, both ways, and
    each value's JSON type (null where the type allows it)."""
    doc = documented()[command]
    row = PLAIN[command]()
    prefix = "[]." if command in ("types", "image") else ""
    top = {p.removeprefix(prefix): t for p, t in doc.items() if "." not in p.removeprefix(prefix)}
    assert set(row) == set(top)
    for key, value in row.items():
        words = top[key]
        if value is None:
            assert words.endswith(" or null"), (key, words)
        elif isinstance(value, list):
            assert words.startswith("array of"), (key, words)
        elif isinstance(value, dict):
            assert words.removesuffix(" or null") in ("object", "map of string"), (key, words)
        else:
            base = words.removesuffix(" or null")
            expected = {"boolean"} if isinstance(value, bool) else {"integer", "number"} \
                if isinstance(value, int) else {SCALARS.get(type(value), "number")}
            assert base in expected, (key, words, value)


# -- real results through the one serialiser ---------------------------------------------------------
def _built() -> dict[str, Any]:
    from gpuprov.results.shapes import (
        UNREACHED,
        Bootstrap,
        ClusterRow,
        HealthCheck,
        HealthResult,
        HostStats,
        ImageUsed,
        KeptNode,
        LockMove,
        MonitorResult,
        NodeImage,
        NodeRow,
        PatchHost,
        PatchResult,
        ProbeRow,
        ProvisionResult,
        PullReport,
        Replacement,
        RunRow,
        Setting,
        SettingsResult,
        StatusResult,
        UpResult,
        VerifyResult,
        VerifySummary,
    )

    node = NodeRow(name="n1", id="i-1", address="10.0.0.1", ssh_port=22, state="running",
                   zone="us-east-1a", instance_type="p4d.24xlarge")
    stats = {"n1": HostStats.of({"ok": 40, "changed": 2, "failed": 0, "unreachable": 0, "tasks": 41}),
             "n2": UNREACHED}
    provision = ProvisionResult(cluster="c", ok=False, hosts=stats, errors={"n2": "unreachable: refused"})
    settings = {"apt_proxy": Setting(value="http://10.0.0.5:3142", from_="GPUPROV_APT_PROXY")}
    health = HealthResult(
        cluster="c", level="quick", ok=False, started="2025", finished="2025",
        checks=[HealthCheck(node="n1", check="ecc", status="fail", found="2 uncorrectable",
                            expected="0", action="drain the node and reset the GPU"),
                HealthCheck(node="n2", check="nvlink", status="skip", found="", expected="", action="",
                            reason="no NVIDIA GPU on the PCI bus")],
        summary=VerifySummary(pass_=0, fail=1, skip=1))
    replaced = [Replacement(old="c-node-2", new="c-node-3", why="bootstrap failed: x", when="2025", kept=True,
                            old_id="i-2", new_id="i-3"),
                Replacement(old="c-node-4", new=None, why="rolled onto image r (lock abc)", when="2025")]
    return {
        "up": UpResult(cluster="c", provider="aws", nodes=[node],
                       bootstrap=Bootstrap.of(provision, PullReport(bundle_sha256="ab" * 32, bundle_bytes=5_000_000,
                                                                    verify=VerifySummary(pass_=9, fail=0, skip=3))),
                       health=health, image=ImageUsed(ref="gpuprov/baked:abc-1", baked_for="abc",
                                                      reason="gpuprov/baked:abc-1 (baked for lock abc)"),
                       replaced=replaced,
                       cost=costs.PlanCost(nodes=4, usd_per_node_hour=21.96, usd_per_hour=87.84, usd_per_day=2108.16,
                                           kind="on-demand", region="us-east-1", zone=None,
                                           source="bundled table", as_of="2026-08-26", why=None),
                       verify=VerifyResult(cluster="c", ok=False, hosts={"n1": [ProbeRow("gpu", "fail", "0 GPUs")]},
                                           summary=VerifySummary(pass_=3, fail=1, skip=2)),
                       verdict=results.Verdict(ready=False, why="1 probe(s) failed (n1)", next="gpuprov verify c")),
        "list": [ClusterRow(name="c", provider="aws", nodes=1, created="2025-01-01T00:00:00+00:00",
                            state="bootstrapped (verify failed)")],
        "status": StatusResult(
            cluster="c", provider="aws", state="verified", failed_step=None, created="2025",
            spec={"count": 1}, stack={"driver": "535.309.01"}, settings=settings, nodes=[node],
            runs=[RunRow(id=1, kind="provision", started="2025", finished=None, ok=None,
                         artifact_dir="/x")],
            images=[NodeImage(node="n1", image="gpuprov/baked:abc-1", baked_for="abc", matches_lock=False)],
            replaced=replaced, kept=[KeptNode(name="c-node-2", id="i-2", address="10.0.0.2", why="bootstrap failed: x",
                                              when="2025")],
            slurm=results.SlurmStatus(controller="n1", nodes={"n1": results.SlurmNode(state="idle", reason=""),
                                                               "n2": results.SlurmNode(state="drained", reason="x")},
                                      dynamic=results.DynamicNodes(
                                          max_count=4, dynamic=2, idle_minutes=10, image="gpuprov/baked:abc-1",
                                          service=results.PowerService(url="http://172.17.0.1:40000/power",
                                                                       running=True, last=["resume c-dy-1: taken"]),
                                          protection=results.Protection(
                                              failures=3, last="gpuprov: resume failed: image gone",
                                              partitions=["gpu"], since="2026-12-06T21:40:00Z"))),
            cost=costs.ClusterCost(nodes=[costs.NodeCost(
                node="n1", launched="2025-01-01T00:00:00+00:00", kind="on-demand", usd_per_hour=21.96,
                usd_so_far=43.92, source="on-demand in us-east-1, bundled table as of 2026-08-26", why=None)],
                usd_per_hour=21.96, usd_so_far=43.92, why=None)),
        "settings": SettingsResult(cluster="c", settings=settings, changed=["apt_proxy"]),
        "health": health,
        "monitor": MonitorResult(cluster="c", ok=True, host="n1", prometheus="http://10.0.0.1:9090",
                                 alertmanager="127.0.0.1:9093 (loopback of the monitoring host)",
                                 tunnel="ssh -N -L 9090:10.0.0.1:9090 admin@203.0.113.7", hosts=stats, errors={}),
        "provision": provision,
        "usage": costs.UsageResult(
            cluster="c", controller="n1", by="user", since="2026-12-06T23:41:00Z", until="2026-12-06T23:43:10Z",
            rows=[costs.UsageRow(key="alice", users=["alice"], accounts=["research"], jobs=3, gpu_hours=0.0083,
                                 node_hours=0.0047, usd=None, why="existing hosts: no price")],
            idle=costs.UsageIdle(gpu_hours=0.13, usd=None, why="existing hosts: no price"),
            total=costs.UsageTotal(gpu_hours=0.1444, usd=None),
            prices={"n1": costs.UsagePrice(usd_per_hour=None, source=None, why="existing hosts: no price")}),
        "slurm": results.SlurmAccounts(cluster="c", controller="n1", accounts=[
            results.SlurmAccount(account="research", users=["alice", "bob"]),
            results.SlurmAccount(account="root", users=[])]),
        "verify": VerifyResult(cluster="c", ok=False, hosts={"n1": [ProbeRow("gpu", "fail", "0 GPUs")]},
                               summary=VerifySummary(pass_=3, fail=1, skip=2)),
        "patch": PatchResult(
            cluster="c", ok=False, batches=[["n1"], ["n2"]], lock=LockMove(from_="abc", to="def"),
            hosts={"n1": PatchHost.of({"status": "failed", "changed": 3, "rebooted": True,
                                       "plan": ["nvidia-driver-535 535.1 -> 535.2"], "moved": ["x 1 -> 2"],
                                       "error": "probes failed", "reboot_skipped": "container",
                                       "plan_error": "check run failed", "nothing_to_move": True}),
                   "n2": PatchHost(status="not-started", changed=0, rebooted=False)}),
    }


@pytest.mark.parametrize("command", sorted(SHAPES))
def test_a_real_result_round_trips_and_shows_only_documented_fields(command: str) -> None:
    data = serialise(_built()[command])
    assert json.loads(json.dumps(data)) == data
    doc = documented()[command]
    found = {_normal(re.sub(r"\.(n1|n2|apt_proxy)(?=$|[.\[])", ".<>", p)) for p in _paths(data)}
    # A map's keys are names, not fields; spec and stack are free-form objects.
    found = {p for p in found if not p.endswith(".<>") and not re.match(r"(spec|stack)\.", p)}
    assert found - set(doc) == set()
    required = {p for p, t in doc.items() if not t.startswith("optional") and "<>" not in p
                and "[]" not in p}
    assert required - found == set()


def test_keywords_and_absent_fields_serialise_as_documented() -> None:
    built = _built()
    verify = serialise(built["verify"])
    assert verify["summary"] == {"pass": 3, "fail": 1, "skip": 2}
    patch = serialise(built["patch"])
    assert patch["lock"] == {"from": "abc", "to": "def"}
    assert patch["hosts"]["n2"] == {"status": "not-started", "changed": 0, "rebooted": False, "plan": []}
    assert "nothing_to_move" not in patch["hosts"]["n1"]
    up = serialise(built["up"])
    assert "dry_run" not in up and "resumed_from" not in up["bootstrap"]
    dry = serialise(results.UpResult(cluster="c", provider="docker", nodes=[], bootstrap=None, dry_run=True))
    assert dry["dry_run"] is True and "health" not in dry
