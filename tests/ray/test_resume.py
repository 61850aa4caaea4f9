"""Contract 7, exact resume: a run that fails after step 22 and restarts from its step-15
checkpoint trains exactly the batches of the uninterrupted run (the session's tiny run, which
`test_train_e2e` checks) and ends with the same weights. A stop request ends a run early with a
checkpoint at the step it stopped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray
import torch

from pipeline.core.config import validate
from pipeline.learn.checkpoint import load_checkpoint
from pipeline.train.history import EvalHistory
from pipeline.train.launch import run
from pipeline.train.loop import FAIL_AT_STEP_ENV, FAIL_MARKER_ENV
from pipeline.train.stop import create_stop_flag, request_stop, stop_flag_name
from tests.helpers import tiny_raw

pytestmark = pytest.mark.ray

CHECKPOINT_EVERY, FAIL_AFTER = 15, 22


def _records(ids_dir: Path) -> list[dict]:
    return [
        json.loads(x)
        for f in sorted(ids_dir.glob("rank*.jsonl"))
        for x in f.read_text().splitlines()
    ]


def _trained(records: list[dict]) -> dict:
    """(epoch, step, rank) -> sample ids, the last time each was trained."""
    return {(r["epoch"], r["step"], r["rank"]): r["ids"] for r in records if "ids" in r}


# About a minute on 2 cores: make test-slow. The default suite keeps contract 7 through
# tests/unit/test_trainer.py (a resumed Trainer, no Ray) and the stop request below.
@pytest.mark.slow
def test_contract7_restart_after_failure_trains_the_same_batches_and_weights(
    cluster, tiny_run, tmp_path, monkeypatch
):
    ref_cfg, ref, _, ref_dir = tiny_run  # the same data, model and batches, never interrupted
    failed_dir = tmp_path / "failed"
    monkeypatch.setenv(FAIL_AT_STEP_ENV, str(FAIL_AFTER))
    monkeypatch.setenv(FAIL_MARKER_ENV, str(tmp_path / "failed-once"))
    cfg = tiny_raw(
        failed_dir,
        train={"record_sample_ids": str(failed_dir / "ids")},
        checkpoint={"run_name": "failed", "every_steps": CHECKPOINT_EVERY, "max_failures": 1},
        eval=ref_cfg.eval.model_dump(),  # the same held-out set and schedule
    )
    resumed = run(validate(cfg))

    # It really failed and restarted from the step-15 checkpoint, on every rank.
    recs = _records(failed_dir / "ids")
    starts = sorted((r["rank"], r["step"]) for r in recs if r.get("event") == "start")
    assert starts == [(0, 0), (0, CHECKPOINT_EVERY), (1, 0), (1, CHECKPOINT_EVERY)]
    assert resumed.steps == ref.steps > FAIL_AFTER

    # After the restart, exactly the uninterrupted run's batches, step by step and rank by rank.
    reference = _trained(_records(ref_dir / "ids"))
    assert _trained(recs) == reference
    after_restart = {}
    for rank in (0, 1):
        mine = [r for r in recs if r["rank"] == rank]
        restart = max(i for i, r in enumerate(mine) if r.get("event") == "start")
        after_restart.update({(r["epoch"], r["step"], rank): r["ids"] for r in mine[restart + 1 :]})
    assert after_restart == {
        k: v for k, v in reference.items() if k[0] > 0 or k[1] >= CHECKPOINT_EVERY
    }

    # And the same model at the end (CPU: equal up to float rounding).
    a, b = load_checkpoint(ref.checkpoint), load_checkpoint(resumed.checkpoint)
    for k in a.model:
        torch.testing.assert_close(b.model[k], a.model[k], rtol=1e-5, atol=1e-6)
    assert resumed.loss == pytest.approx(ref.loss, rel=1e-5)

    # Held-out evaluations: the one lost with the failure (step 20) is done again, none twice.
    got, want = (EvalHistory.read_dir(s.checkpoint).arrays() for s in (resumed, ref))
    assert got["step"].tolist() == want["step"].tolist()
    assert 20 in got["step"].tolist()
    torch.testing.assert_close(
        torch.tensor(got["loss"]), torch.tensor(want["loss"]), rtol=1e-5, atol=1e-6
    )


# A whole run for one step (~25 s): make test-slow. The default suite keeps the trainer's side (every
# rank stops at the same step with a checkpoint: tests/unit/test_trainer.py) and the driver's signal
# handler (tests/ray/test_driver_control.py).
@pytest.mark.slow
def test_stop_request_ends_the_run_with_a_checkpoint_at_the_next_step(cluster, tmp_path):
    """The driver's side of Ctrl-C / SIGTERM: a request on the run's stop flag makes every
    worker finish its step, checkpoint there and return; fit() ends normally."""
    cfg = validate(
        tiny_raw(
            tmp_path,
            train={"epochs": 1, "record_sample_ids": str(tmp_path / "ids")},
            checkpoint={"run_name": "stopped"},
        )
    )
    flag = create_stop_flag(stop_flag_name(cfg.checkpoint.run_name))
    request_stop(flag, "SIGTERM")  # before the first step: the run stops after step 1
    try:
        summary = run(cfg)
    finally:
        ray.kill(flag)
    state = load_checkpoint(summary.checkpoint)
    assert summary.steps == state.position.steps_done == 1
    assert (state.position.epoch, state.position.next_step) == (0, 1)
    starts = [r for r in _records(tmp_path / "ids") if r.get("event") == "start"]
    assert len(starts) == 2  # no failure, no restart
