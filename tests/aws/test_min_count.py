"""`up --min-count K`: a launch that comes back short in every zone is accepted when it brings
at least K nodes (EC2's MinCount/MaxCount, emulated per zone by the shim's ``capacity``);
without it, all --count or nothing, as before."""

from __future__ import annotations

import json

from tests.aws.conftest import instances
from tests.aws.helpers import assert_nothing_left, assert_refused, invoke, up
from tests.aws.moto_shim import Shim

ZONES = ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d")


def _short(shim: Shim, **left: int) -> None:
    """Every zone short of 4 p4d; ``left`` as given, 2 elsewhere."""
    shim.capacity.update({z: 2 for z in ZONES})
    shim.capacity.update({z.replace("_", "-"): n for z, n in left.items()})


def test_a_short_launch_is_accepted_at_min_count_and_a_rerun_adds_the_rest(capsys, shim: Shim, ami: str) -> None:
    _short(shim, us_east_1c=3)
    code, out, err = up(capsys, ami, "short", "--min-count", "3")
    assert code == 0, err
    # every zone was asked for all 4 first, then for at least 3 (MinCount 3, MaxCount 4)
    asked = [(c.params["Placement.AvailabilityZone"], c.params["MinCount"], c.params["MaxCount"])
             for c in shim.run_calls()]
    assert asked == [(z, "4", "4") for z in ZONES] + [("us-east-1a", "3", "4"), ("us-east-1b", "3", "4"),
                                                      ("us-east-1c", "3", "4")], asked
    assert "--min-count 3 accepts 3 or more" in err
    assert "launched 3 of 4 (--min-count 3): the cluster has 3 of its 4 node(s)" in err
    running = instances("short")
    assert len(running) == 3 and {i["Placement"]["AvailabilityZone"] for i in running} == {"us-east-1c"}
    assert len(json.loads(out)["nodes"]) == 3

    # Capacity comes back: `up` again launches the missing one (and only it).
    shim.capacity.clear()
    shim.calls.clear()
    code, _, err = up(capsys, ami, "short")
    assert code == 0, err
    assert [c.params["MinCount"] for c in shim.run_calls()] == ["1"], err
    assert len(instances("short")) == 4


def test_without_min_count_a_short_launch_is_all_or_nothing(capsys, shim: Shim, ami: str) -> None:
    _short(shim, us_east_1c=3)
    code, _, err = up(capsys, ami, "strict")
    assert code == 1
    assert err.strip().splitlines()[-1].startswith("gpuprov: no capacity for 4 x p4d.24xlarge in any zone")
    assert [c.params["MinCount"] for c in shim.run_calls()] == ["4"] * len(ZONES)
    assert_nothing_left("strict")


def test_min_count_not_reached_anywhere_leaves_nothing(capsys, shim: Shim, ami: str) -> None:
    _short(shim)  # 2 left in every zone
    code, _, err = up(capsys, ami, "tooshort", "--min-count", "3")
    assert code == 1
    assert err.strip().splitlines()[-1].startswith("gpuprov: no capacity for 3 x p4d.24xlarge in any zone")
    assert_nothing_left("tooshort")


def test_min_count_is_checked_before_anything_is_made(capsys, shim: Shim, ami: str) -> None:
    code, out, err = up(capsys, ami, "bad", "--min-count", "5")
    assert_refused(code, out, err, "--min-count 5 must be between 1 and --count 4", shim)
    code, out, err = invoke(capsys, "up", "--provider", "docker", "--count", "2", "--min-count", "1",
                            "--name", "local", "--yes")
    assert_refused(code, out, err, "--min-count is for --provider aws", shim)
