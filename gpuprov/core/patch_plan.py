"""`gpuprov patch`'s request and plan: what to move (validated before anything is touched),
the lock after the roll, what would move on each node, what moved, and the drain and resume
hooks. The roll itself is in patch.py."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, cast

from gpuprov.errors import BadInput
from gpuprov.lock import cuda_lines, stack
from gpuprov.lock.lock_data import LockData
from gpuprov.lock.stack_choice import StackChoice
from gpuprov.sharing import choice as sharing_choice
from gpuprov.sharing import layouts as sharing_layouts
from gpuprov.state import NodeRecord

REPORT_TASK = "Report the patch"

HOOK_TIMEOUT = 1800


@dataclass(frozen=True)
class Request:
    """What to move; validated by ``request`` before anything is touched."""

    driver: str | None = None  # target branch or release; None: the lock's branch
    kernel_module: str | None = None  # target flavour (open, proprietary); None: the lock's
    move_driver: bool = False
    kernel: bool = False
    microcode: bool = False
    batch: int = 1
    check: bool = False
    reboot: bool = True
    drain: str | None = None
    resume: str | None = None
    mirror_url: str | None = None
    mirror_key_fingerprint: str | None = None
    onto_image: str | None = None  # roll by replacing nodes from this baked image (or "newest")
    grace: int | None = None  # Slurm clusters: seconds a drained node's jobs get (None: the default)
    force: bool = False  # Slurm clusters: do not wait for the jobs of a drained node
    via: str = "push"  # where the plays run: push (Ansible from here) or pull (gpuprov.core.patch_pull)
    cuda: str | None = None  # target CUDA line (toolkit, cuDNN and NCCL move with it); None: the lock's
    # `--gpu-sharing` (mig:LAYOUT, mps, shard:N, none): recorded in the lock and applied on each
    # node by the gpu_sharing role (playbooks/patch.yml); None: the lock's, not applied.
    gpu_sharing: str | None = None


def request(*, all_: bool = False, **kw: Any) -> Request:
    """A validated request; ``all_`` moves the driver (to the lock's branch pin unless
    ``driver`` says otherwise), the kernel and microcode."""
    if all_:
        kw.update(kernel=True, microcode=True)
    kw["move_driver"] = bool(kw.get("driver")) or bool(kw.get("kernel_module")) or all_
    choice = StackChoice(driver=kw.get("driver"), kernel_module=kw.get("kernel_module"),
                         mirror_url=kw.get("mirror_url"),
                         mirror_key_fingerprint=kw.get("mirror_key_fingerprint"),
                         gpu_sharing=kw.get("gpu_sharing")).checked()
    kw.update(driver=choice.driver, kernel_module=choice.kernel_module, mirror_url=choice.mirror_url,
              mirror_key_fingerprint=choice.mirror_key_fingerprint, gpu_sharing=choice.gpu_sharing)
    if kw.get("cuda") is not None:
        kw["cuda"] = cuda_lines.spelled(kw["cuda"])
    req = Request(**kw)
    if not (req.move_driver or req.kernel or req.microcode or req.onto_image or req.cuda or req.gpu_sharing):
        raise BadInput("nothing to patch: give --driver VERSION|BRANCH, --kernel-module, --cuda LINE, "
                       "--gpu-sharing MODE, --kernel, --microcode, --all or --onto-image")
    if req.batch < 1:
        raise BadInput(f"--batch must be at least 1, not {req.batch}")
    if req.grace is not None and req.grace < 0:
        raise BadInput(f"--grace must be 0 or more seconds, not {req.grace}")
    if req.force and req.grace is not None:
        raise BadInput("--force does not wait for jobs: leave out --grace, or --force")
    if req.via not in ("push", "pull"):
        raise BadInput(f"--via is push or pull, not {req.via!r}")
    if req.via == "pull" and req.onto_image is not None:
        raise BadInput("--via pull rolls the plays on the nodes; --onto-image replaces the nodes (leave out one)")
    if req.onto_image is not None and (req.force or req.grace is not None):
        raise BadInput("--grace and --force go with a roll in place, not with --onto-image")
    for flag, hook in (("--drain", req.drain), ("--resume", req.resume)):
        if hook is not None and not hook.strip():
            raise BadInput(f"{flag} is empty: give a shell command, or leave the option out")
    return req


# What a CUDA line puts in a lock (gpuprov.lock.cuda_lines.pieces): they move together, and with
# them the package names of the toolkit, cuDNN and NCCL (the lock's packages.cuda*, cudnn*).
CUDA_KEYS = ("cuda", "cuda_version", "cuda_archives", "cudnn", "cudnn_archive", "cudnn_archive_sha256", "nccl",
             "nccl_tests", "nccl_tests_sha256", "base_images", "site_pip_requirements", "notes")


def moves_cuda(lock: LockData, req: Request) -> bool:
    """Whether the roll moves the CUDA line (``--cuda`` naming another line than the lock's)."""
    return req.cuda is not None and req.cuda != lock.get("cuda")


def new_lock(lock: LockData, req: Request) -> LockData:
    """The lock after the patch: a new driver through the resolver (fabric manager moves
    with it); a new CUDA line through it too (its toolkit, cuDNN, NCCL and base images), held
    to the driver the cluster will run; microcode pins from the current stack data; everything
    else as it was."""
    cuda: str = (req.cuda or lock["cuda"]) if moves_cuda(lock, req) else lock["cuda"]
    if cuda != lock["cuda"]:
        late = cuda_lines.not_installed_yet(cuda, lock.get("instance_type") or "TYPE", lock["source"], lock.get("os"))
        if late:
            raise BadInput(f"--cuda {cuda}: {late}")
    # The kernel module flavour moves only when asked (--kernel-module); else it stays what the
    # cluster runs (a lock from before flavours installed the proprietary one).
    # Read field by field below (its keys as data): a plain mapping of the resolved lock.
    fresh: dict[str, Any] = {**stack.resolve_types(stack.kinds_of(lock), cuda=cuda, os=lock.get("os"),
                                driver=req.driver or lock["driver_branch"], source=lock["source"],
                                label=lock.get("instance_type") or "unknown",
                                kernel_module=req.kernel_module or lock.get("kernel_module")
                                or "proprietary").as_dict()}
    out: dict[str, Any]
    if req.move_driver:
        moved: dict[str, Any] = {k: fresh[k] for k in ("driver_branch", "driver", "fabricmanager", "kernel_module",
                                       "driver_branch_kind", "driver_eol") if k in fresh}
        packages = {k: v for k, v in lock.get("packages", {}).items() if k != "pinning"}
        packages.update({k: fresh["packages"][k] for k in
                         ("driver", "driver_version", "fabricmanager", "fabricmanager_version", "pinning")
                         if k in fresh["packages"]})
        out = {**lock, **moved, "packages": packages}
    else:
        out = {**lock}
    if cuda != lock["cuda"]:
        out.update({k: fresh[k] for k in CUDA_KEYS if k in fresh})
        for gone in [k for k in out if k in CUDA_KEYS and k not in fresh]:
            del out[gone]
        packages = {k: v for k, v in out["packages"].items() if not k.startswith(("cuda", "cudnn", "nccl"))}
        packages.update({k: v for k, v in fresh["packages"].items() if k.startswith(("cuda", "cudnn", "nccl"))})
        out["packages"] = packages
    if req.microcode or "microcode" not in out:
        out["microcode"] = fresh["microcode"]
    if req.gpu_sharing is not None:
        out["gpu_sharing"] = _sharing(lock, req.gpu_sharing)
    body = {k: v for k, v in out.items() if k != "hash"}
    out["hash"] = stack.from_dict(cast(LockData, body)).short_hash()
    return cast(LockData, out)  # the lock's own keys, moved: a LockData again


def _sharing(lock: LockData, asked: str) -> str:
    """The lock's new GPU sharing, checked against its hosts' GPUs (BadInput: one line)."""
    sharing = sharing_choice.parse(asked)
    sharing_layouts.checked(sharing, stack.kinds_of(lock))
    return sharing.spelled()


def patch_vars(extravars: dict[str, Any], req: Request, lock: LockData,
               old: LockData | None = None) -> dict[str, Any]:
    """The playbook variables of a roll (``BadInput`` for a mirror lock without its mirror);
    ``old``: the lock the nodes run now (a CUDA move names the line it leaves)."""
    # --cuda: the line is (re)applied, and what the line the nodes run now left behind is taken out.
    cuda_move = str(old["cuda"]) if old is not None and req.cuda is not None else None
    if (req.move_driver or cuda_move) and lock["source"] == "mirror" and not (
            req.mirror_url or extravars["gpuprov_mirror_url"]):
        raise BadInput("this cluster's packages come from a mirror: give --mirror-url and "
                       f"--mirror-key-fingerprint for the {'driver' if req.move_driver else 'CUDA'} move")
    extravars = extravars | {
        "gpuprov_patch_driver": req.move_driver,
        "gpuprov_patch_kernel": req.kernel,
        "gpuprov_patch_microcode": req.microcode,
        "gpuprov_patch_reboot": req.reboot,
        "gpuprov_patch_cuda": cuda_move is not None,
        "gpuprov_patch_cuda_from": cuda_move or "",
        "gpuprov_patch_gpu_sharing": req.gpu_sharing is not None,
    }
    if req.mirror_url:
        extravars["gpuprov_mirror_url"] = req.mirror_url
        extravars["gpuprov_mirror_key_fingerprint"] = req.mirror_key_fingerprint or ""
    return extravars


def what_of(req: Request, lock: LockData) -> str:
    parts = []
    if req.move_driver:
        parts.append(f"driver {lock['driver']} ({lock.get('kernel_module') or 'proprietary'} kernel modules)"
                     + (f" + fabric manager {lock['fabricmanager']}" if lock.get("fabricmanager") else ""))
    if req.cuda:
        parts.append(f"CUDA {lock['cuda']} (cuDNN {lock.get('cudnn')}, NCCL {lock.get('nccl')})")
    if req.kernel:
        parts.append("kernel")
    if req.microcode:
        parts.append("microcode")
    if req.gpu_sharing is not None:
        parts.append(f"GPU sharing {lock.get('gpu_sharing') or 'none'}")
    return ", ".join(parts) + (" [check]" if req.check else "") + f", batches of {req.batch}"


# -- what the playbook reports ------------------------------------------------------------
def host_reports(artifact_dir: Path) -> dict[str, dict[str, Any]]:
    """Each host's ``Report the patch`` message from ansible-runner's job events."""
    out: dict[str, dict[str, Any]] = {}
    events = artifact_dir / "job_events"
    for path in sorted(events.glob("*.json")) if events.is_dir() else ():
        try:
            event = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        data = event.get("event_data") or {}
        if event.get("event") == "runner_on_ok" and data.get("task") == REPORT_TASK:
            msg = (data.get("res") or {}).get("msg")
            if isinstance(msg, dict):
                out[data.get("host", "?")] = msg
    return out


def plan_of(report: dict[str, Any], lock: LockData, req: Request,
            old: LockData | None = None) -> list[str]:
    """What would move on a node, read from its report of the check-mode run: packages in
    (the new lock's, at its release), packages out (the old lock's and NVIDIA release pins that
    the new lock does not name), for a driver move the reboot it needs (or why none), and for
    ``--gpu-sharing`` the gpu_sharing role's steps on the node's GPUs, in order."""
    if "before" not in report:  # no report: the node's check run failed (its plan_error says why)
        return []
    before: dict[str, str] = report.get("before") or {}
    plan = []
    if req.move_driver:
        driver_moves = _driver_plan(before, lock, old or LockData())
        plan += driver_moves
        if driver_moves and "container" in report:
            plan.append(_reboot_plan(report))
    if moves_cuda(old or LockData(), req):
        plan += _cuda_plan(report, lock)
    if req.kernel:
        plan += [f"{name} -> newest" for name in report.get("kernel_upgradable") or []]
    if req.microcode:
        vendor = report.get("cpu_vendor")
        package = {"intel": "intel-microcode", "amd": "amd64-microcode"}.get(str(vendor))
        pin = (lock.get("microcode") or {}).get(str(vendor))
        have = before.get(package or "")
        if package and (have is None or (pin and have != pin)):
            plan.append(f"{package} {have or 'not installed'} -> {pin or 'newest'}")
    if req.gpu_sharing is not None:
        plan += [f"GPU sharing: {step}" for step in report.get("gpu_sharing_steps") or []]
    return plan


def top_packages(lock: LockData) -> list[str]:
    """The packages a lock installs by name: the release pin, the driver's, fabric manager."""
    packages = lock.get("packages") or {}
    names = [packages["pinning"]] if packages.get("pinning") else []
    names += list(packages.get("driver") or [])
    if lock.get("fabricmanager") and packages.get("fabricmanager"):
        names.append(packages["fabricmanager"])
    return names


def _driver_plan(before: dict[str, str], lock: LockData, old: LockData) -> list[str]:
    packages = lock["packages"]
    targets = dict.fromkeys(top_packages(lock), packages["driver_version"])
    if packages.get("pinning"):
        targets[packages["pinning"]] = "installed"
    moves = []
    for name, target in targets.items():
        have = before.get(name)
        if have is None or (target != "installed" and not fnmatch(have, target)):
            moves.append(f"{name} {have or 'not installed'} -> {target}")
    leaving = [n for n in top_packages(old) if n not in targets]
    leaving += [n for n in before if n.startswith("nvidia-driver-pinning-") and n not in targets]
    return moves + [f"{name} {before[name]} -> removed" for name in dict.fromkeys(leaving) if name in before]


def _cuda_plan(report: dict[str, Any], lock: LockData) -> list[str]:
    """A CUDA move on one node, from its check-mode report: the line it runs (where /usr/local/cuda
    points) to the lock's, how the new one comes, and what of the old one is taken out."""
    if "cuda_line" not in report:  # a report without the CUDA fields (a node_patch before them)
        return []
    have = str(report.get("cuda_line") or "")
    if have == lock["cuda"]:
        return []
    packages = lock.get("packages") or {}
    if lock.get("cuda_archives"):
        how = "NVIDIA's redist archives from the artifact mirror: " + ", ".join(
            a["component"] for a in lock["cuda_archives"])
    else:
        how = f"{packages.get('cuda')} {packages.get('cuda_version')}"
    plan = [f"CUDA {have or 'none'} -> {lock['cuda']} ({how}; cuDNN {lock.get('cudnn')}, NCCL {lock.get('nccl')})"]
    leaving: dict[str, str] = report.get("cuda_leaving") or {}
    plan += [f"{name} {version} -> removed" for name, version in sorted(leaving.items())]
    if report.get("cuda_old_prefix"):
        plan.append(f"{report['cuda_old_prefix']} -> removed")
    return plan


def _reboot_plan(report: dict[str, Any]) -> str:
    if report.get("container"):
        return "reboot: none (container node: it shares the kernel of its host)"
    if not int(report.get("gpus") or 0):
        return "reboot: none (no NVIDIA GPU on the PCI bus: no module to load)"
    return "reboot: only if the nvidia module cannot be reloaded (and reboots are allowed)"


def moved_of(report: dict[str, Any]) -> list[str]:
    before: dict[str, str] = report.get("before") or {}
    after: dict[str, str] = report.get("after") or {}
    moved = [f"{k} {before.get(k, 'none')} -> {v}" for k, v in sorted(after.items()) if before.get(k) != v]
    moved += [f"{k} {v} -> removed" for k, v in sorted(before.items()) if k not in after]
    line, now = str(report.get("cuda_line") or ""), str(report.get("cuda_line_after") or "")
    if now and line != now:
        moved.append(f"CUDA {line or 'none'} -> {now}")
        moved += [f"{k} {v} -> removed" for k, v in sorted((report.get("cuda_leaving") or {}).items())]
        moved += [f"{report['cuda_old_prefix']} -> removed"] if report.get("cuda_old_prefix") else []
    return moved


def regressions(before: Sequence[dict[str, str]], after: Sequence[dict[str, str]]) -> list[str]:
    """Probes that fail after the patch but did not fail before it."""
    failed_before = {r["probe"] for r in before if r["status"] == "fail"}
    return [f"{r['probe']}: {r['detail']}" for r in after
            if r["status"] == "fail" and r["probe"] not in failed_before]


def batches_of(names: Sequence[str], size: int) -> list[list[str]]:
    return [list(names[i:i + size]) for i in range(0, len(names), size)]


# -- hooks ------------------------------------------------------------------------------------
def run_hook(command: str, cluster: str, node: NodeRecord, phase: str) -> tuple[bool, str]:
    """A drain or resume hook: a shell command on this machine, told which node it is for."""
    env = {**os.environ, "GPUPROV_CLUSTER": cluster, "GPUPROV_NODE": node.name,
           "GPUPROV_NODE_ADDRESS": node.address, "GPUPROV_HOOK": phase}
    try:
        proc = subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True, text=True,
                              timeout=HOOK_TIMEOUT, check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return False, f"{phase} hook timed out after {HOOK_TIMEOUT}s"
    tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or [""]
    return proc.returncode == 0, f"{phase} hook exited {proc.returncode}: {tail[0]}".rstrip(": ")
