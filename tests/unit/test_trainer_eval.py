"""Held-out evaluation inside a run (no Ray): no side effects on training, evaluations at the
points `eval:` names, and a resumed run that neither repeats nor skips one."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from pipeline.learn.logger import ListLogger
from pipeline.train.loop import FAIL_AT_STEP_ENV, FAIL_MARKER_ENV
from tests.unit.trainer_fixtures import (
    STEPS,
    Saver,
    batches_for,
    config,
    held_out_batches,
    trainer,
)

DROPOUT = {"dropout": 0.2}  # so that a consumed RNG draw would change what trains
EVAL = {"path": "unused", "every_steps": 2, "at_start": True}


def _fit(tmp, cfg, **kw):
    saver, logger = Saver(tmp), ListLogger()
    t = trainer(tmp, cfg, saver, **kw)
    assert t.fit(batches_for(), logger) == "done"
    return t, saver, logger


def test_contract11_a_run_with_evaluation_trains_exactly_what_it_trains_without(tmp_path):
    plain, _, _ = _fit(tmp_path / "a", config(tmp_path / "a", model=DROPOUT))
    cfg = config(tmp_path / "b", model=DROPOUT, eval=EVAL)
    evaluated, saver, logger = _fit(tmp_path / "b", cfg, eval_batches=held_out_batches())
    assert len(evaluated.evals) > 0
    a, b = plain.history.arrays(), evaluated.history.arrays()
    np.testing.assert_array_equal(a["loss"], b["loss"])  # bit for bit: the same RNG draws
    for k, v in plain.model.state_dict().items():
        torch.testing.assert_close(evaluated.model.state_dict()[k], v, rtol=0, atol=0)
    assert evaluated.model.training  # back in training mode after each evaluation


def test_evaluations_run_at_start_every_n_steps_at_epoch_ends_and_once_at_the_run_end(tmp_path):
    cfg = config(tmp_path, eval={"path": "unused", "every_steps": 4, "at_start": True})
    t, _, logger = _fit(tmp_path, cfg, eval_batches=held_out_batches())
    # 2 epochs of 6 steps: start, 4, 6 (epoch end), 8, 12 (every 4, epoch end and run end: once)
    assert t.evals.steps() == [0, 4, 6, 8, 12]
    logged = [s for s, m in logger.records if "eval/loss" in m]
    assert logged == [0, 4, 6, 8, 12]
    losses = [m["eval/loss"] for _, m in logger.records if "eval/loss" in m]
    assert len(set(losses)) == len(losses)  # each evaluates the weights of its own step
    m = next(m for _, m in logger.records if "eval/loss" in m)
    assert {"eval/accuracy", "eval/loss_per_sample", "eval/tokens", "eval/samples"} <= m.keys()
    assert any(k.startswith("eval/loss_by_bucket/") for k in m)


def test_contract11_a_resumed_run_neither_repeats_nor_skips_an_evaluation(tmp_path):
    ref, _, ref_log = _fit(
        tmp_path / "ref", config(tmp_path / "ref", eval=EVAL), eval_batches=held_out_batches()
    )
    d = tmp_path / "run"
    cfg = config(d, eval=EVAL)
    saver = Saver(d)
    os.environ[FAIL_AT_STEP_ENV], os.environ[FAIL_MARKER_ENV] = "5", str(d / "failed")
    try:  # fails after step 5: the step-4 evaluation is lost with it, the step-3 checkpoint kept
        t = trainer(d, cfg, saver, eval_batches=held_out_batches())
        with pytest.raises(RuntimeError, match="injected failure after global step 5"):
            t.fit(batches_for(), ListLogger())
        t = trainer(d, cfg, saver, eval_batches=held_out_batches())
        assert t.steps_done == 3 and t.evals.steps() == [0, 2]
        assert t.fit(batches_for(), ListLogger()) == "done"
    finally:
        del os.environ[FAIL_AT_STEP_ENV], os.environ[FAIL_MARKER_ENV]
    got, want = saver.latest_evals().arrays(), ref.evals.arrays()
    assert got["step"].tolist() == want["step"].tolist() == [0, 2, 4, 6, 8, 10, 12]
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
    assert len(ref_log.records) > 0


def test_no_evaluation_without_an_eval_section_or_without_held_out_batches(tmp_path):
    t, _, logger = _fit(tmp_path / "a", config(tmp_path / "a"), eval_batches=held_out_batches())
    assert len(t.evals) == 0
    assert not any("eval/loss" in m for _, m in logger.records)
    assert t.steps_done == 2 * STEPS


def test_async_evaluations_ask_ray_to_evaluate_a_checkpoint_of_each_evaluation_step(tmp_path):
    cfg = config(
        tmp_path, eval={"path": "unused", "every_steps": 4, "at_start": True, "mode": "async"}
    )
    t, saver, logger = _fit(tmp_path, cfg, eval_batches=held_out_batches())
    assert len(t.evals) == 0  # nothing evaluated in the training loop
    asked = [(n, v["step"], v["epoch"]) for n, v in saver.validations]
    assert [s for _, s, _ in asked] == [0, 4, 6, 8, 12]
    assert [e for _, _, e in asked] == [0, 0, 0, 1, 1]
    names = [n for n, _ in saver.reports]
    assert all(n in names for n, _, _ in asked)  # each one is a reported checkpoint
    # The every-3-steps and epoch-end checkpoints are still written, each once.
    assert names == sorted(set(names))
    assert {f"checkpoint_step{s:08d}" for s in (3, 6, 9, 12)} <= set(names)
