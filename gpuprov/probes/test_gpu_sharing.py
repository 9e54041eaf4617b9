"""Probes of the GPU sharing the lock records (`--gpu-sharing`, docs/gpu-sharing.md), one per
claim, together `gpu_sharing_matches_the_lock`: the MIG mode is the one the sharing needs
(enabled for mig, disabled for mps and shard), no MIG mode change waits for a reset, a MIG
layout's GPU instances are all there on every GPU, and MPS has
its control daemon running. Shards ask nothing of the GPU (Slurm time-shares it): the MIG mode
probe is their one check. Each skips, saying why, on a node without GPUs or a lock without sharing.

The gpu_sharing role applies the sharing on the nodes (roles/gpu_sharing); these probes say what
a node lacks, they do not fix it."""

from __future__ import annotations

from collections import Counter

import pytest

from gpuprov import catalog
from gpuprov.probes.test_gpu import _gpus_expected
from gpuprov.sharing import choice, layouts, smi

pytestmark = pytest.mark.gpu

MIG_MODE_COMMAND = "nvidia-smi -q -x"


def _sharing(host, expect) -> choice.Sharing:
    """The lock's sharing; skips where the node has no GPU or the lock asks none."""
    _gpus_expected(host, expect)
    sharing = choice.of_lock(expect.lock().get("gpu_sharing"))
    if sharing.mode == "none":
        pytest.skip("the lock asks no GPU sharing (--gpu-sharing)")
    return sharing


def _modes(host) -> list[smi.MigMode]:
    out = host.run(MIG_MODE_COMMAND)
    modes = smi.mig_modes_xml(out.stdout) if out.rc == 0 else []
    assert modes, (f"expected `{MIG_MODE_COMMAND}` to report each GPU's MIG mode, found exit {out.rc}: "
                   f"{(out.stdout or out.stderr).strip()[:300]}")
    return modes


def test_gpu_sharing_matches_the_lock_mig_mode(host, expect, report):
    sharing = _sharing(host, expect)
    want = "Enabled" if sharing.mode == "mig" else "Disabled"
    # A GPU without MIG reports N/A: right for mps and shard, wrong for mig.
    ok = (want,) if sharing.mode == "mig" else (want, "N/A")
    modes = _modes(host)
    wrong = [f"{m.gpu}: {m.current}" for m in modes if m.current not in ok]
    assert not wrong, (f"expected MIG mode {want} on every GPU ({sharing.spelled()} in the lock), found "
                       + "; ".join(wrong))
    report(f"MIG mode {want} on {len(modes)} GPU(s), as {sharing.spelled()} needs")


def test_gpu_sharing_matches_the_lock_no_mig_mode_change_pending(host, expect, report):
    sharing = _sharing(host, expect)
    modes = _modes(host)
    pending = [f"{m.gpu}: current {m.current}, pending {m.pending}" for m in modes if m.reset_pending]
    assert not pending, ("expected no MIG mode change waiting for a GPU reset, found " + "; ".join(pending)
                         + " (the change is in effect only once the GPU is reset with no client attached)")
    report(f"no MIG mode change pending on {len(modes)} GPU(s) ({sharing.spelled()})")


def test_gpu_sharing_matches_the_lock_mig_instances(host, expect, report):
    sharing = _sharing(host, expect)
    if sharing.mode != "mig":
        pytest.skip(f"{sharing.spelled()}: no MIG instances to check")
    known = catalog.find(expect.instance_type or "")
    model = layouts.model_for(sharing, expect.gpu_model or expect.lock().get("gpu"),
                              known.gpu_memory_gib if known else 0)
    assert model is not None, (f"expected a GPU model with layout {sharing.layout}, found "
                               f"{expect.gpu_model or expect.lock().get('gpu') or 'no GPU model'} in the lock")
    layout = Counter(model.layouts[sharing.layout])
    renamed = {other: name for name, (other, _) in model.renamed.items()}
    gis = smi.instances_per_gpu(smi.gpu_instances(host.run("nvidia-smi mig -lgi").stdout))
    found = []
    for index in range(len(_modes(host))):
        have = Counter({renamed.get(name, name): n for name, n in gis.get(index, Counter()).items()})
        if have != layout:
            found.append(f"GPU {index}: {_spelled(have) or 'no GPU instance'}")
    assert not found, (f"expected {_spelled(layout)} on each GPU ({sharing.spelled()}, {model.name}), found "
                       + "; ".join(found))
    report(f"{_spelled(layout)} on each GPU ({sharing.spelled()}, {model.name})")


def test_gpu_sharing_matches_the_lock_mps_daemon(host, expect, report):
    sharing = _sharing(host, expect)
    if sharing.mode != "mps":
        pytest.skip(f"{sharing.spelled()}: no MPS control daemon asked"
                    + (" (shards: Slurm time-shares the GPU; nothing on the GPU side)" if sharing.mode == "shard"
                       else ""))
    out = host.run("pgrep -x nvidia-cuda-mps-control")
    assert out.rc == 0, "expected the MPS control daemon (nvidia-cuda-mps-control) running, found none"
    report(f"nvidia-cuda-mps-control running (pid {out.stdout.split()[0]})")


def _spelled(per: Counter[str]) -> str:
    return " + ".join(f"{n} x {name}" for name, n in sorted(per.items()))
