"""Review 4's "done when": every parser of node or cloud output holds over mutated recordings,
as tests/unit/test_review4_numbers.py does for nccl-tests, manifests and pull reports (the same
seeded standard-library mutator, tests/fixtures/mutate.py: the project does not depend on
hypothesis). A bad
field means "not checked" (or the item left out) for that node or that type, never an
exception for the whole cluster; only each parser's documented exception escapes.

What is mutated, and from where:

- nvidia-smi (``--query-gpu`` CSV, ``-q``, ``nvlink -s``), /proc/driver/nvidia/version, the PCI
  census, the kernel log, dcgmi diag and nccl-tests: the h100-sxm5-580 and h200-580 recordings
  (tests/fixtures/recordings, tests/fixtures/health_recordings.py's sections), one or more
  sections at a time, through every check of the standard level (gpuprov.health.evaluate),
  dcgmi's tables also through gpuprov.health.dcgm.parse and diag_check
  (tests/fixtures/recordings/dcgm-published);
- sinfo: no recording in the repository but tests/unit/test_counts.py's sample (Slurm 22.05.8
  on two local nodes of this machine);
- the price list: no recording (moto has no Price List API): the document
  tests/aws/test_pricing_aws.py answers with (tests/fixtures/price_list.py: the API's shape,
  its values edited);
- the spot price history: no recording: rows in DescribeSpotPriceHistory's shape as botocore
  gives them, their prices the bundled catalog's (gpuprov/catalog/instance_types.json);
- the catalog (``from_api``): tests/unit/test_catalog.py's DescribeInstanceTypes records and
  every type of the bundled catalog as such a record; only BadRecord escapes.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gpuprov import catalog
from gpuprov.health import dcgm, evaluate, parse
from gpuprov.health.facts import Expect, Facts
from gpuprov.health.gather import Section
from gpuprov.pricing import live
from gpuprov.slurm.scheduler import parse_sinfo
from tests.fixtures.health_recordings import LOCK, REC, sections
from tests.fixtures.mutate import mutate_text as _mutate_text
from tests.fixtures.mutate import mutate_value as _mutate_value
from tests.fixtures.price_list import document as _document

EXAMPLES = 1500  # each property: a second or two on one core
STATUSES = {"pass", "fail", "skip", "warn"}
NCCL = (REC / "h100-sxm5-580" / "nccl-tests.txt").read_text()
DCGM = sorted((REC / "dcgm-published").glob("*.txt"))
SINFO = "s1-node-1|idle|none\ns1-node-1|idle|none\ns1-node-2|drained|by hand\ns1-node-2|drained|by hand\n"
B200 = {"InstanceType": "p6-b200.48xlarge",
        "GpuInfo": {"Gpus": [{"Name": "B200", "Count": 8, "MemoryInfo": {"SizeInMiB": 183359}}]},
        "VCpuInfo": {"DefaultVCpus": 192}, "MemoryInfo": {"SizeInMiB": 2097152},
        "NetworkInfo": {"EfaSupported": True, "EfaInfo": {"MaximumEfaInterfaces": 8}, "MaximumNetworkCards": 8}}
G5G = {"InstanceType": "g5g.xlarge", "ProcessorInfo": {"SupportedArchitectures": ["arm64"]},
       "VCpuInfo": {"DefaultVCpus": 4}, "MemoryInfo": {"SizeInMiB": 8192},
       "GpuInfo": {"Gpus": [{"Name": "T4g", "Manufacturer": "NVIDIA", "Count": 1, "MemoryInfo": {"SizeInMiB": 15360}}]},
       "NetworkInfo": {"EfaSupported": False, "MaximumNetworkCards": 1}}


def _machines() -> list[tuple[dict[str, Section], Expect]]:
    out = []
    for machine, model in (("h100-sxm5-580", "H100"), ("h200-580", "H200")):
        found = sections(machine, {})
        found["dcgm_diag"] = Section(DCGM[0].read_text(), 0)
        found["nccl_tests"] = Section(NCCL, 0)
        out.append((found, Expect(gpus=1, gpu_model=model, lock=LOCK)))
        out.append((found, Expect(instance_type="p5.48xlarge", gpus=8, gpu_model="H100", nvswitch=True,
                                  efa_interfaces=32, lock=LOCK)))
    return out


def test_no_exception_escapes_a_nodes_checks_on_mutated_nvidia_smi_and_node_recordings() -> None:
    rng = random.Random(54)
    machines = _machines()
    for _ in range(EXAMPLES):
        base, expect = rng.choice(machines)
        found = dict(base)
        for name in rng.sample(sorted(found), rng.randint(1, 3)):
            text = _mutate_text(rng, found[name].text) if found[name].text else rng.choice(["\x00", "ERR!", "9" * 99])
            found[name] = Section(text, rng.choice([found[name].rc, 0, 1, 124, 127, None]))
        rows = evaluate("n1", Facts(found), expect, rng.choice(["quick", "standard"]))
        assert rows and all(r.status in STATUSES and isinstance(r.found, str) for r in rows), rows
        parse.smi_q(found["smi_q"].text)
        parse.query_csv(found["smi_ids"].text)
        parse.nvlink_status(found["nvlink"].text)


def test_no_exception_escapes_dcgmis_parser_and_verdict_on_mutated_recordings() -> None:
    rng = random.Random(54)
    texts = [p.read_text() for p in DCGM]
    for _ in range(EXAMPLES):
        text = _mutate_text(rng, rng.choice(texts))
        dcgm.parse(text)
        row = dcgm.diag_check("n1", text, rng.choice([0, 1, 226, None, 124, 127]), level=rng.choice([2, 3]),
                              expected="every test passes")
        assert row.status in STATUSES and row.found


def test_no_exception_escapes_sinfos_parser_on_mutated_output() -> None:
    rng = random.Random(54)
    for _ in range(EXAMPLES):
        rows = parse_sinfo(_mutate_text(rng, SINFO))
        assert all(name and node.state for name, node in rows.items())


def test_a_price_document_that_cannot_be_read_is_left_out_and_the_others_answer() -> None:
    good = _document("p5.48xlarge", "52.5000000000", "us-east-1")
    for bad in ("{not json", "[]", json.dumps({"terms": {"OnDemand": {"x": {"priceDimensions": {"y": {
            "unit": "Hrs", "pricePerUnit": {"USD": "many"}}}}}}}), json.dumps({"product": []}), "null"):
        assert live.on_demand_usd([bad, good]) == 52.5, bad
        assert live.on_demand_usd([bad]) is None
    for odd in ("nan", "inf", "-1", "0", "1e999"):
        assert live.on_demand_usd([good.replace("52.5000000000", odd)]) is None, odd


def test_no_exception_escapes_the_price_list_reader_on_mutated_documents() -> None:
    rng = random.Random(54)
    base = json.loads(_document("p5.48xlarge", "52.5000000000", "us-east-1"))
    for number in range(EXAMPLES):
        if number % 3 == 0:
            raw = bytearray(json.dumps(base).encode())
            for _ in range(rng.randint(1, 4)):
                raw[rng.randrange(len(raw))] = rng.randrange(32, 127)
            docs: list[Any] = [raw.decode()]
        else:
            docs = [json.dumps(_mutate_value(rng, base)), _mutate_value(rng, base)]
        usd = live.on_demand_usd(docs)
        assert usd is None or (isinstance(usd, float) and 0 < usd < float("inf"))


def _spot_rows() -> list[dict[str, Any]]:
    """DescribeSpotPriceHistory's rows as botocore gives them (Timestamp a datetime, SpotPrice
    text), for the bundled catalog's AWS types at a third of their bundled on-demand price
    (an empty GPUPROV_HOME: the bundled catalog alone)."""
    at = datetime(2026, 11, 1, tzinfo=UTC)
    rows = []
    for i, itype in enumerate(t for t in catalog.all_types() if t.provider == "aws" and t.price.get("us-east-1")):
        for zone in ("us-east-1a", "us-east-1b"):
            rows.append({"AvailabilityZone": zone, "InstanceType": itype.name, "ProductDescription": "Linux/UNIX",
                         "SpotPrice": f"{itype.price['us-east-1'] / 3:.6f}", "Timestamp": at + timedelta(hours=i)})
    return rows


def _ec2(rows: list[dict[str, Any]]) -> Any:
    pages = SimpleNamespace(paginate=lambda **_: [{"SpotPriceHistory": rows}])
    return SimpleNamespace(ec2=SimpleNamespace(get_paginator=lambda _: pages))


def test_a_spot_row_that_cannot_be_read_is_left_out_and_the_others_answer(gpuprov_home: Path) -> None:
    rows = _spot_rows()
    name = rows[0]["InstanceType"]
    bad = [{**rows[0], "SpotPrice": "many"}, {**rows[0], "SpotPrice": "nan"}, {**rows[0], "Timestamp": "then"},
           {**rows[0], "AvailabilityZone": None}, {"SpotPrice": "1"}, "row", {**rows[0], "SpotPrice": "-2"}]
    found = live.fetch_spot(_ec2(bad + rows), [name])
    assert found[name]["us-east-1a"][0] == float(rows[0]["SpotPrice"])
    start = datetime(2026, 10, 1, tzinfo=UTC)
    steps = live.history(_ec2(bad + rows[:2]), name, "us-east-1a", start, start + timedelta(days=60))
    assert steps == [(rows[0]["Timestamp"], float(rows[0]["SpotPrice"]))]


def test_no_exception_escapes_the_spot_history_readers_on_mutated_rows(gpuprov_home: Path) -> None:
    rng = random.Random(54)
    rows = _spot_rows()
    names = sorted({r["InstanceType"] for r in rows})
    start = datetime(2026, 11, 1, 12, tzinfo=UTC)
    for _ in range(EXAMPLES):
        mutated = [_mutate_value(rng, r) if rng.random() < 0.3 else r for r in rng.sample(rows, 8)]
        for name, zones in live.fetch_spot(_ec2(mutated), names).items():
            assert all(0 < usd < float("inf") and isinstance(since, str) for usd, since in zones.values()), name
        steps = live.history(_ec2(mutated), rng.choice(names), "us-east-1a", start, start + timedelta(days=2))
        live.spot_cost(steps, start, start + timedelta(days=2))


def test_only_bad_record_escapes_the_catalog_on_mutated_records(gpuprov_home: Path) -> None:
    rng = random.Random(54)
    bundled = [{"InstanceType": t.name, "GpuInfo": {"Gpus": [{"Name": t.gpu_model or "", "Count": t.gpu_count,
                                                                "MemoryInfo": {"SizeInMiB": t.gpu_memory_gib * 1024}}]},
                "VCpuInfo": {"DefaultVCpus": t.vcpus or 1}, "NetworkInfo": {"EfaSupported": t.efa}}
               for t in catalog.all_types() if t.provider == "aws"]
    records = [B200, G5G, *bundled]
    for _ in range(EXAMPLES):
        record = _mutate_value(rng, rng.choice(records))
        try:
            itype = catalog.from_api(record, "us-east-1")
        except catalog.BadRecord:
            continue
        assert isinstance(itype.name, str) and isinstance(itype.gpu_count, int)


def test_the_recordings_are_read_as_they_are() -> None:
    """The properties above start from parses that hold: the recordings are what they say."""
    assert parse_sinfo(SINFO)["s1-node-2"].reason == "by hand"
    assert live.on_demand_usd([_document("p5.48xlarge", "52.5000000000", "us-east-1")]) == 52.5
    assert catalog.from_api(B200, "us-east-1").gpu_count == 8
    assert all(dcgm.parse(p.read_text()).tests for p in DCGM)
    assert Path(REC / "h200-580" / "q-ECC.txt").exists()
