"""What one `up` creates is computed once, in core (gpuprov.core.counts), for every provider;
and which flags a provider takes is read from its options type alone."""

from __future__ import annotations

import dataclasses

import click
import pytest

from gpuprov import defaults
from gpuprov.cli.app import up
from gpuprov.core import counts
from gpuprov.errors import BadInput
from gpuprov.providers import ClusterSpec, Plan, get, names, options_type


def plan(provider: str, count: int | None, existing: int, **kw) -> Plan:
    spec = ClusterSpec(name="c", provider=provider, instance_type=None, count=count,
                       options=options_type(provider)(), **kw)
    return Plan(spec=spec, existing=existing, billable=False)


@pytest.mark.parametrize(("count", "existing", "kept", "least", "to_create", "min_create"), [
    (4, 0, 0, None, 4, 4),  # a new cluster: all of it, all or nothing
    (4, 1, 0, None, 3, 3),  # completing one
    (4, 4, 0, None, 0, 0),  # complete: nothing to launch
    (4, 0, 0, 2, 4, 2),  # --min-count 2: a short launch may bring 2
    (4, 1, 0, 2, 3, 1),  # one member already: one more reaches K
    (4, 3, 0, 2, 1, 1),  # K met already: still at least one node a launch
    (4, 3, 1, 2, 2, 1),  # a kept node carries the label but is no member
])
def test_core_counts_what_to_create_once(count, existing, kept, least, to_create, min_create) -> None:
    out = counts.counted(plan("docker", count, existing, min_count=least), get("docker"), kept)
    assert (out.existing, out.to_create, out.min_create) == (existing - kept, to_create, min_create)


@pytest.mark.parametrize("provider", ["aws", "docker"])
def test_no_provider_shrinks_a_cluster(provider: str) -> None:
    with pytest.raises(BadInput, match=r"already has 3 node\(s\), more than --count 2; gpuprov does not shrink"):
        counts.counted(plan(provider, 2, 3), get(provider))


def test_hosts_that_exist_are_adopted_not_created() -> None:
    out = counts.counted(plan("static", None, 5), get("static"))
    assert (out.existing, out.to_create, out.min_create) == (5, 0, 0)


def test_each_provider_option_is_a_flag_of_up_with_the_same_name() -> None:
    """The options type is the one declaration: each field is an `up` parameter of that name,
    whose flag is the one the field declares."""
    params = {p.name: p for p in up.params if isinstance(p, click.Option)}
    params["os"] = params.pop("os_name")
    for name in names():
        for field_name, flag_name in options_type(name).flags().items():
            assert flag_name in params[field_name].opts, (name, field_name)
        assert {f.name for f in dataclasses.fields(options_type(name))} == set(options_type(name).flags())


def test_the_choices_of_up_are_the_constants() -> None:
    params = {p.name: p for p in up.params}
    assert tuple(params["os_name"].type.choices) == defaults.AWS_OS
    assert tuple(params["source"].type.choices) == defaults.PACKAGE_SOURCES
    assert tuple(params["kernel_module"].type.choices) == defaults.KERNEL_MODULES
    assert defaults.DEFAULT_CUDA in params["cuda"].help


def test_a_spec_survives_its_record() -> None:
    """What the state records reads back as the same typed request (the shape of the first
    state version: region, image, ssh_cidr, spot, hosts_file at the top)."""
    spec = ClusterSpec(name="c", provider="aws", instance_type="g5.xlarge", count=3, min_count=2, retries=0,
                       options=options_type("aws")(region="eu-west-1", spot=True, disk_gb=300, os="debian12"),
                       settings={"apt_proxy": {"value": "http://p:3142", "from": "env"}})
    raw = spec.as_dict()
    assert raw["region"] == "eu-west-1" and raw["spot"] is True and raw["options"]["disk_gb"] == 300
    assert ClusterSpec.from_record("c", "aws", raw) == spec


def test_sinfo_lines_become_states_and_reasons() -> None:
    """`sinfo --noheader --Node --format=%N|%T|%E` as Slurm 22.05.8 printed it on two local nodes
    of this machine (2026-11-27), one drained by hand; a node is listed once per partition."""
    from gpuprov.slurm.scheduler import parse_sinfo

    text = ("s1-node-1|idle|none\ns1-node-1|idle|none\n"
            "s1-node-2|drained|by hand\ns1-node-2|drained|by hand\n")
    rows = parse_sinfo(text)
    assert {n: (r.state, r.reason) for n, r in rows.items()} == {
        "s1-node-1": ("idle", ""), "s1-node-2": ("drained", "by hand")}


def test_slurm_is_not_pulled(capsys, gpuprov_home) -> None:
    """A pull bundle carries no secret, so a Slurm cluster is never bootstrapped by pull."""
    from tests.conftest import invoke

    code, _, err = invoke(capsys, "up", "--provider", "docker", "--count", "1", "--name", "sp",
                          "--scheduler", "slurm", "--bootstrap", "pull")
    assert code == 2 and "--scheduler slurm is set up by push" in err and len(err.strip().splitlines()) == 1
    assert not (gpuprov_home / "clusters" / "sp").exists()
