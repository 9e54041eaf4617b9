"""What DCGM's diagnostic says: ``dcgmi diag -r LEVEL`` output, as plain data, and the
verdict on it (health check ``dcgm_diag``, the standard level).

gpuprov reads dcgmi's text table, the form every recording in tests/fixtures/recordings/
shows (no real ``-j`` JSON of an A100 or H100 run was found to test a JSON reader on):

    Successfully ran diagnostic for group.
    +---------------------------+------------------------------------------------+
    | Diagnostic                | Result                                         |
    +===========================+================================================+
    |-----  Metadata  ----------+------------------------------------------------|
    | DCGM Version              | 3.3.3                                          |
    |-----  Deployment  --------+------------------------------------------------|
    | Persistence Mode          | Fail                                           |
    | Error                     | Persistence mode for GPU 0 is currently disab  |
    |                           | led. ...                                       |
    +-----  Stress  ------------+------------------------------------------------+
    | Targeted Power            | Pass - GPUs: 0, 2, 3                           |
    |                           | Fail - GPU: 1                                  |
    | Warning                   | GPU 1 Max power of 224.1 did not reach desire  |

A category starts at a ``-----  NAME  ---`` row; a test's row gives its name and a result
(``Pass``, ``Pass - All``, ``Fail - GPU: 1``, ``Skip - All``; DCGM 4 puts ``GPU0: Pass``
rows under a test's overall result); ``Error``, ``Warning`` and ``Info`` rows, and rows with
an empty first column, continue the test above them (dcgmi wraps long text at the column's
width, mid-word). DCGM 2 says ``Blacklist`` where 3 says ``Denylist``, and has no Metadata.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuprov.results.shapes import HealthCheck

CHECK = "dcgm_diag"
_ROW = re.compile(r"^\|([^|]*)\|(.*)\|$")
_CATEGORY = re.compile(r"^[|+]-{3,}\s+(\w[\w ]*?)\s+-+\+")
_RESULT = re.compile(r"^(Pass|Fail|Warn|Skip)\b(?:\s*-\s*(.*))?$", re.IGNORECASE)
_PER_GPU = re.compile(r"^GPU\s?(\d+)\s*:\s*(Pass|Fail|Warn|Skip)\b", re.IGNORECASE)
_NOTES = {"error": "errors", "warning": "warnings", "info": "info"}
# Category -> what a failure there asks of whoever is on call.
ACTIONS = {
    "deployment": "fix the node's software as the message says (persistence mode, a process on the GPU, "
                  "the driver's libraries), then run the diagnostic again",
    "integration": "drain the node; a PCIe or NVLink link below its speed or width: reseat or RMA the GPU or "
                   "baseboard the message names",
    "hardware": "drain the node and run `dcgmi diag -r 3`; RMA the GPU it names if the failure recurs",
    "stress": "drain the node and run `dcgmi diag -r 3`; RMA the GPU it names if the failure recurs "
              "(a power or thermal failure: check the node's power and cooling first)",
}


@dataclass
class Test:
    """One test's results: its overall status per GPU set, and its messages."""

    category: str
    name: str
    results: list[tuple[str, str]] = field(default_factory=list)  # (status, GPUs as printed)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    info: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(s == "fail" for s, _ in self.results)

    @property
    def failed_gpus(self) -> str:
        return "; ".join(g for s, g in self.results if s == "fail" and g)


@dataclass
class Report:
    """A diagnostic run: its metadata and tests in printed order."""

    ran: bool  # dcgmi said "Successfully ran diagnostic" and printed its table
    metadata: dict[str, str] = field(default_factory=dict)
    tests: list[Test] = field(default_factory=list)

    @property
    def failures(self) -> list[Test]:
        return [t for t in self.tests if t.failed]


def _gpus(status: str, rest: str) -> str:
    rest = rest.strip()
    return rest if rest else ""


def parse(text: str) -> Report:
    """dcgmi diag's table. Text before it (a prompt, a banner) and after it is ignored."""
    report = Report(ran="Successfully ran diagnostic" in text)
    category, test, note = "", None, None
    seen_table = False
    for raw in text.splitlines():
        line = raw.rstrip()
        if m := _CATEGORY.match(line):
            category, test, note = m.group(1).strip(), None, None
            continue
        m = _ROW.match(line)
        if not m:
            continue
        # The result cell as printed, less its padding: one space before, two after (dcgmi
        # wraps long text at the cell's width less one, mid-word, so that a wrapped message
        # is its cells joined as they are).
        name, cell = m.group(1).strip(), m.group(2)[1:-2]
        value = cell.strip()
        if name == "Diagnostic" and value == "Result":
            seen_table = True
            continue
        if category.lower() == "metadata":
            if name:
                report.metadata[name] = value
            elif report.metadata:  # a wrapped metadata value
                key = list(report.metadata)[-1]
                report.metadata[key] += value
            continue
        if name.lower() in _NOTES and test is not None:
            note = _NOTES[name.lower()]
            getattr(test, note).append(cell)
            continue
        if not name:
            if test is None:
                continue
            if r := _RESULT.match(value):
                test.results.append((r.group(1).lower(), _gpus(r.group(1), r.group(2) or "")))
                note = None
            elif g := _PER_GPU.match(value):
                test.results.append((g.group(2).lower(), f"GPU {g.group(1)}"))
                note = None
            elif note is not None:
                getattr(test, note)[-1] += cell
            continue
        test, note = Test(category or "?", name), None
        report.tests.append(test)
        if r := _RESULT.match(value):
            test.results.append((r.group(1).lower(), _gpus(r.group(1), r.group(2) or "")))
    report.ran = report.ran and seen_table
    for t in report.tests:  # joined wrapped cells: the words whole, the padding gone
        t.errors, t.warnings, t.info = ([" ".join(n.split()) for n in notes]
                                        for notes in (t.errors, t.warnings, t.info))
    return report


def _error_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip().lower().startswith(("error", "unable", "failed")):
            return line.strip()
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return lines[-1] if lines else "no output"


def diag_check(node: str, text: str, rc: int | None, *, level: int, expected: str) -> HealthCheck:
    """The verdict on one ``dcgmi diag -r LEVEL`` run: every test passed, warned or skipped.
    A failed test names its category, its GPUs and dcgmi's own message; its action comes from
    the category (ACTIONS)."""

    def row(status: str, found: str, action: str = "") -> HealthCheck:
        return HealthCheck(node=node, check=CHECK, status=status, found=found, expected=expected, action=action)

    if rc == 127 or "dcgmi: not found" in text or "dcgmi: command not found" in text:
        return row("fail", "dcgmi is not installed", "install NVIDIA DCGM (datacenter-gpu-manager, its "
                   "nvidia-dcgm service running) from the lock's NVIDIA repository, or run --level quick")
    if rc == 124 or rc is None:
        return row("fail", f"dcgmi diag -r {level} did not finish in its time budget",
                   "drain the node and reboot it, then run the diagnostic again by hand: one that hangs is a failure")
    report = parse(text)
    if not report.ran or not report.tests:
        found = _error_line(text)
        action = ("start the DCGM host engine (systemctl start nvidia-dcgm) and run it again"
                  if "host engine" in text.lower() else "read the raw output: the diagnostic did not run to its table")
        return row("fail", f"dcgmi diag -r {level}: {found}", action)
    version = report.metadata.get("DCGM Version")
    summary = f"{len(report.tests)} test(s)" + (f", DCGM {version}" if version else "")
    failures = report.failures
    if not failures:
        warned = [t.name for t in report.tests if any(s == "warn" for s, _ in t.results)]
        skipped = [t.name for t in report.tests if t.results and all(s == "skip" for s, _ in t.results)]
        extra = (f"; warned: {', '.join(warned)}" if warned else "") + (
            f"; skipped: {', '.join(skipped)}" if skipped else "")
        return row("pass", f"dcgmi diag -r {level}: {summary}, none failed{extra}")
    parts = []
    for t in failures:
        where = f" ({t.failed_gpus})" if t.failed_gpus else ""
        message = (t.errors or t.warnings or [""])[0]
        parts.append(f"{t.category}/{t.name} failed{where}" + (f": {_short(message)}" if message else ""))
    worst = max((t.category.lower() for t in failures), key=lambda c: list(ACTIONS).index(c) if c in ACTIONS else 9)
    return row("fail", f"dcgmi diag -r {level}: " + "; ".join(parts),
               ACTIONS.get(worst, ACTIONS["hardware"]))


def _short(message: str, limit: int = 240) -> str:
    message = " ".join(message.split())
    return message if len(message) <= limit else message[: limit - 3] + "..."
