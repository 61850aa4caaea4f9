"""Runs compared at equal real tokens and time: W&B's x axes, and every logged training and
held-out point carrying where the run is in both."""

from __future__ import annotations

import sys
import types

import numpy as np

from pipeline.learn.logger import ELAPSED_S, REAL_TOKENS, ListLogger, WandbLogger, define_axes
from tests.unit.trainer_fixtures import Saver, batches_for, config, held_out_batches, trainer


class _FakeRun:
    def __init__(self):
        self.defined: dict[str, str | None] = {}
        self.settings = types.SimpleNamespace(_offline=True)

    def define_metric(self, name, step_metric=None, **kw):
        self.defined[name] = step_metric


def test_wandb_draws_training_and_held_out_series_against_real_tokens(tmp_path, monkeypatch):
    run = _FakeRun()
    fake = types.SimpleNamespace(init=lambda **kw: run, Settings=lambda **kw: None)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    WandbLogger(config(tmp_path), run_id="x", mode="offline", directory=str(tmp_path))
    assert run.defined[REAL_TOKENS] is None and run.defined[ELAPSED_S] is None
    assert run.defined["train/*"] == REAL_TOKENS and run.defined["eval/*"] == REAL_TOKENS
    again = _FakeRun()
    define_axes(again)
    assert again.defined == run.defined


def test_every_logged_point_says_its_real_tokens_and_training_seconds(tmp_path):
    cfg = config(tmp_path, eval={"path": "unused", "every_steps": 4, "at_start": True})
    t = trainer(tmp_path, cfg, Saver(tmp_path), eval_batches=held_out_batches())
    logger = ListLogger()
    assert t.fit(batches_for(), logger) == "done"
    h = t.history.arrays()
    real, secs = np.cumsum(h["real"]), np.cumsum(h["seconds"])
    train = [(s, m) for s, m in logger.records if "train/loss" in m]
    evals = [(s, m) for s, m in logger.records if "eval/loss" in m]
    assert len(train) == t.steps_done and len(evals) >= 3
    for step, m in train + evals:
        want = real[step - 1] if step else 0.0
        assert m[REAL_TOKENS] == want
        assert m[ELAPSED_S] == (secs[step - 1] if step else 0.0)
    assert [m[REAL_TOKENS] for _, m in train] == sorted(m[REAL_TOKENS] for _, m in train)
