"""Host-device synchronisations per optimizer step on a GPU: CUDA's sync debug mode warns at every
synchronising call (a blocking copy, `.item()`, a stream synchronise); a few steps of the
Trainer (one process, no Ray, the stream prefetched onto the device) may warn once per optimizer
step, the copy of the step's figures to the host. Checkpoints, which read every weight, are not
counted. Skipped without a CUDA GPU; the CPU count of the same steps is
`tests/unit/test_step_syncs.py`."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import torch

from pipeline.learn.logger import ListLogger
from tests.unit.trainer_fixtures import STEPS, Saver, batches_for, config, spec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _sync_warnings(caught) -> int:
    return sum("synchronizing" in str(w.message) for w in caught)


@pytest.mark.parametrize("grad_accum", [1, 2])
@pytest.mark.parametrize("bf16", ["off", "on"])
def test_at_most_one_synchronisation_per_optimizer_step(tmp_path, grad_accum, bf16):
    from pipeline.train.trainer import Trainer

    cfg = config(tmp_path, grad_accum=grad_accum, bf16=bf16)
    s = dataclasses.replace(
        spec(tmp_path), device=torch.device("cuda", torch.cuda.current_device())
    )
    t = Trainer(cfg, s, save=Saver(tmp_path))
    t.resume(None)
    t.stop = lambda: False  # a poller, as every Ray Train rank has one
    per_step: list[int] = []
    counted: list = []
    step, checkpoint = t.step, t.checkpoint

    def counted_step(*a, **kw):
        per_step.append(_sync_warnings(counted))
        return step(*a, **kw)

    def uncounted_checkpoint(*a, **kw):
        torch.cuda.set_sync_debug_mode(0)
        try:
            return checkpoint(*a, **kw)
        finally:
            torch.cuda.set_sync_debug_mode("warn")

    t.step, t.checkpoint = counted_step, uncounted_checkpoint
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        counted = caught
        torch.cuda.set_sync_debug_mode("warn")
        try:
            assert t.fit(batches_for(), ListLogger()) == "done"
        finally:
            torch.cuda.set_sync_debug_mode(0)
    per_step.append(_sync_warnings(caught))
    syncs = np.diff(per_step)
    where = [str(w.message)[:200] for w in caught if "synchronizing" in str(w.message)][:5]
    assert len(syncs) == 2 * STEPS // grad_accum
    assert syncs.max() <= 1, (syncs.tolist(), where)
    assert syncs.sum() == len(syncs)  # the one is seen: the mode counts what it should
    assert np.isfinite(t.last_loss)
