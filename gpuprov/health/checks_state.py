"""The quick level's GPU state checks, read from `nvidia-smi -q -d
ECC,ROW_REMAPPER,TEMPERATURE,PERFORMANCE`: uncorrectable ECC, row remapping, clock event
reasons, temperature.

Memory errors and row remapping: NVIDIA's GPU Memory Error Management guide
(https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/): an uncorrectable error marks its
row for remapping, which takes effect at the next GPU reset ("Pending: Yes"); a remap that
failed ("Remapping Failure Occurred: Yes") means the memory cannot be repaired in the field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuprov.health import parse
from gpuprov.health.checks_gpu import ALERT_C, RESET, RMA, failed, no_gpu, passed, skipped
from gpuprov.health.facts import Expect, Facts
from gpuprov.results.shapes import HealthCheck

PerGpu = Callable[[str, parse.Tree], str | None]


def _each_gpu(check: str, facts: Facts, expect: Expect, problem: PerGpu) -> tuple[HealthCheck | None, list[str]]:
    """The skip (no GPU) or failure (no report) that ends ``check`` early, else None and the
    problems ``problem`` finds, one per GPU that has one."""
    if reason := no_gpu(facts, expect):
        return skipped(check, reason), []
    if not facts.q:
        out = (facts.text("smi_q").strip().splitlines() or ["no output"])[-1]
        if facts.rc("smi_q") == 127 or "No such file" in out or "not found" in out:
            return failed(check, "no nvidia-smi (driver not installed)", "a report for every GPU",
                          f"install the driver: `{expect.provision}`"), []
        return failed(check, f"nvidia-smi -q reported no GPU ({out})", "a report for every GPU",
                      "drain and reboot the node: the GPUs do not answer nvidia-smi"), []
    return None, [f"{bus}: {p}" for bus, tree in facts.q.items() if (p := problem(bus, tree))]


def _uncorrectable(tree: parse.Tree) -> int:
    """Volatile uncorrectable ECC errors: the "Uncorrectable" counters of ECC Errors >
    Volatile (SRAM parity, SRAM SEC-DED, DRAM on Hopper; "Double Bit" > "Total" on older
    drivers)."""
    volatile = parse.at(tree, "ECC Errors", "Volatile") or {}
    total = sum(parse.number(v) or 0 for k, v in volatile.items() if "Uncorrectable" in k and isinstance(v, str))
    return total + (parse.number(parse.at(volatile, "Double Bit", "Total")) or 0)


def ecc(facts: Facts, expect: Expect) -> HealthCheck:
    def problem(_bus: str, tree: parse.Tree) -> str | None:
        mode = parse.at(tree, "ECC Mode", "Current")
        if mode is not None and mode != "Enabled":
            return f"ECC mode {mode}"
        count = _uncorrectable(tree)
        return f"{count} uncorrectable volatile ECC error(s)" if count else None

    early, problems = _each_gpu("ecc", facts, expect, problem)
    want = "ECC enabled, 0 uncorrectable volatile ECC errors on every GPU"
    if early:
        return early
    if any("ECC mode" in p for p in problems):
        return failed("ecc", "; ".join(problems), want, "enable ECC (nvidia-smi -e 1) and reboot the node")
    if problems:
        return failed("ecc", "; ".join(problems), want, RESET + " (the reset clears the volatile count and "
                      "activates the row remap)")
    return passed("ecc", f"0 uncorrectable volatile ECC errors on {len(facts.q)} GPU(s)", want)


def row_remap(facts: Facts, expect: Expect) -> HealthCheck:
    def problem(_bus: str, tree: parse.Tree) -> str | None:
        rows = parse.at(tree, "Remapped Rows")
        if not isinstance(rows, dict):
            return None  # before Ampere: no row remapper (page retirement instead)
        bad = [k for k in ("Remapping Failure Occurred", "Pending") if rows.get(k) == "Yes"]
        return ", ".join(f"{k}: Yes" for k in bad) or None

    early, problems = _each_gpu("row_remap", facts, expect, problem)
    want = "no pending row remap and no remap failure on every GPU"
    if early:
        return early
    if any("Failure" in p for p in problems):
        return failed("row_remap", "; ".join(problems), want, RMA + " (a row remap failed: the GPU's memory "
                      "cannot be repaired in the field)")
    if problems:
        return failed("row_remap", "; ".join(problems), want, "drain the node and reset the GPU: the remap "
                      "takes effect at reset")
    return passed("row_remap", f"no pending remap, no failure on {len(facts.q)} GPU(s)", want)


# Clock event reasons that mean the hardware protects itself. nvidia-smi's names (section
# "Clocks Event Reasons", "Clocks Throttle Reasons" before driver 535), as the recordings show.
HW_REASONS = ("HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown")


def _reasons(tree: parse.Tree) -> dict[str, str]:
    section = parse.at(tree, "Clocks Event Reasons|Clocks Throttle Reasons") or {}
    flat = {k: v for k, v in section.items() if isinstance(v, str)}
    for value in section.values():
        if isinstance(value, dict):
            flat |= {k: v for k, v in value.items() if isinstance(v, str)}
    return flat


def clocks(facts: Facts, expect: Expect) -> HealthCheck:
    def problem(_bus: str, tree: parse.Tree) -> str | None:
        active = [r for r in HW_REASONS if _reasons(tree).get(r) == "Active"]
        return ", ".join(active) or None

    early, problems = _each_gpu("clocks", facts, expect, problem)
    want = f"none of {', '.join(HW_REASONS)} active"
    if early:
        return early
    if any("Power Brake" in p for p in problems):
        return failed("clocks", "; ".join(problems), want, "drain the node and check its power supplies (the "
                      "board asserted power brake); RMA if the supplies are fine")
    if problems:
        return failed("clocks", "; ".join(problems), want, "drain the node and check its cooling (fans, inlet "
                      "air, airflow); RMA if the GPU slows down while cool")
    return passed("clocks", f"no hardware slowdown on {len(facts.q)} GPU(s)", want)


@dataclass(frozen=True)
class Temperatures:
    """A GPU's temperature and its own thresholds (°C, None where not reported), absolute
    whichever form the driver printed (``form``: "absolute", "relative" or "none")."""

    current: int | None
    shutdown: int | None = None
    slowdown: int | None = None
    max_operating: int | None = None
    form: str = "none"

    def limits(self) -> str:
        """The thresholds reported, as "max operating 87 °C, slowdown 89 °C, shutdown 95 °C"."""
        named = [("max operating", self.max_operating), ("slowdown", self.slowdown), ("shutdown", self.shutdown)]
        return ", ".join(f"{name} {value} °C" for name, value in named if value is not None)


# The thresholds of `nvidia-smi -q -d TEMPERATURE`, by the words both forms share.
_THRESHOLDS = {"shutdown": "GPU Shutdown", "slowdown": "GPU Slowdown", "max_operating": "GPU Max Operating"}


def thresholds(tree: parse.Tree) -> Temperatures:
    """A GPU's temperature and thresholds from its `nvidia-smi -q` Temperature section.

    Drivers before 580 print absolute thresholds ("GPU Shutdown Temp: 92 C", "GPU Slowdown
    Temp: 89 C", "GPU Max Operating Temp: 87 C": the H800 on driver 525 in
    tests/fixtures/recordings/h800-525-published/); they are read as printed, even where a
    "GPU T.Limit Temp" line stands beside them (that H800's 35 + 51 is not its 87). Driver
    580 prints margins instead: "GPU T.Limit Temp: 54 C" is the distance from the current
    temperature to the T.Limit point, and "GPU Slowdown T.Limit Temp: -2 C" the distance
    from a threshold to that point, so threshold = current + T.Limit - <threshold> T.Limit:
    33 + 54 - (-8, -2, 0) = 95, 89, 87 °C on the recorded H100, the shutdown, slowdown and
    max operating thresholds NVML reports for it (tests/fixtures/recordings/h100-sxm5-580/
    nvml.txt, q-TEMPERATURE.txt)."""
    temp = parse.at(tree, "Temperature") or {}
    current = parse.number(temp.get("GPU Current Temp"))
    absolute = {k: parse.number(temp.get(f"{words} Temp")) for k, words in _THRESHOLDS.items()}
    if any(v is not None for v in absolute.values()):
        return Temperatures(current, **absolute, form="absolute")
    margin = parse.number(temp.get("GPU T.Limit Temp"))
    relative = {k: parse.number(temp.get(f"{words} T.Limit Temp")) for k, words in _THRESHOLDS.items()}
    if current is None or margin is None or all(v is None for v in relative.values()):
        return Temperatures(current)
    return Temperatures(current, **{k: None if v is None else current + margin - v for k, v in relative.items()},
                        form="relative")


def temperature(facts: Facts, expect: Expect) -> HealthCheck:
    readings = {bus: thresholds(tree) for bus, tree in facts.q.items()}

    def problem(bus: str, _tree: parse.Tree) -> str | None:
        t = readings[bus]
        if t.current is None:
            return "no temperature reading"
        limit = min(ALERT_C, t.slowdown) if t.slowdown is not None else ALERT_C
        if t.current < limit:
            return None
        return f"{t.current} °C (limit {limit} °C)" + (f"; the GPU's own {t.limits()}" if t.limits() else "")

    early, problems = _each_gpu("temperature", facts, expect, problem)
    slows = sorted({t.slowdown for t in readings.values() if t.slowdown is not None})
    slowdown = f" and below the GPU's slowdown ({', '.join(map(str, slows))} °C)" if slows else ""
    want = f"below {ALERT_C} °C{slowdown}"
    if early:
        return early
    if problems:
        return failed("temperature", "; ".join(problems), want, "drain the node and check its cooling (fans, "
                      "inlet air, airflow); the GPU slows itself down at its slowdown temperature")
    hottest = max(t.current for t in readings.values() if t.current is not None)
    return passed("temperature", f"hottest GPU {hottest} °C", want)
