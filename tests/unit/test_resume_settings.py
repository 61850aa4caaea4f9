"""A resume trains with the optimizer settings of the config it is given (a lower train.lr after
a loss spike), keeping the checkpoint's moments and schedule position, and says what changed in
one line; a resume under another model is refused naming the fields, before any weight loads."""

from __future__ import annotations

import os

import pytest
import torch

from pipeline.learn.checkpoint import ResumeError
from pipeline.learn.logger import ListLogger
from pipeline.learn.optim import lr_factor
from pipeline.train.faults import FAIL_AT_STEP_ENV, FAIL_MARKER_ENV
from tests.unit.trainer_fixtures import Saver, batches_for, config, trainer


def _stopped_at_step_3(tmp_path, **train):
    """A run (train.lr=1e-2) that failed after step 4 and left its step-3 checkpoint."""
    saver = Saver(tmp_path)
    os.environ[FAIL_AT_STEP_ENV], os.environ[FAIL_MARKER_ENV] = "4", str(tmp_path / "failed")
    try:
        t = trainer(tmp_path, config(tmp_path, **train), saver)
        with pytest.raises(RuntimeError, match="injected failure"):
            t.fit(batches_for(), ListLogger())
    finally:
        del os.environ[FAIL_AT_STEP_ENV], os.environ[FAIL_MARKER_ENV]
    return saver


def test_a_resume_trains_at_the_new_lr_decay_and_betas_and_says_so_once(tmp_path, capsys):
    saver = _stopped_at_step_3(tmp_path)
    capsys.readouterr()
    new = config(tmp_path, lr=1e-3, weight_decay=0.05, betas=(0.8, 0.9), grad_clip=0.5)
    t = trainer(tmp_path, new, saver)
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if "new optimizer settings" in ln]
    assert len(lines) == 1
    for change in (
        "train.lr: 0.01 -> 0.001",
        "train.weight_decay: 0.1 -> 0.05",
        "train.betas: [0.9, 0.95] -> [0.8, 0.9]",
        "train.grad_clip: 1.0 -> 0.5",
    ):
        assert change in lines[0]
    k = t.scheduler.last_epoch
    assert k == 3  # the schedule's position is the checkpoint's
    factor = lr_factor(k, warmup=2, total=12, schedule="cosine", min_ratio=0.1)
    assert t.scheduler.base_lrs == [1e-3, 1e-3]
    assert [g["lr"] for g in t.optimizer.param_groups] == pytest.approx([1e-3 * factor] * 2)
    assert [g["weight_decay"] for g in t.optimizer.param_groups] == [0.05, 0.0]  # no decay stays
    assert all(g["betas"] == (0.8, 0.9) for g in t.optimizer.param_groups)
    moments = saver.latest().optimizer["state"]
    for i, st in t.optimizer.state_dict()["state"].items():  # the moments are the checkpoint's
        torch.testing.assert_close(st["exp_avg"], moments[i]["exp_avg"])
    t.fit(batches_for(), ListLogger())
    assert t.history.rows["lr"][3] == pytest.approx(1e-3 * factor)  # step 4, at the new lr


def test_a_resume_with_the_same_settings_says_nothing(tmp_path, capsys):
    saver = _stopped_at_step_3(tmp_path)
    capsys.readouterr()
    t = trainer(tmp_path, config(tmp_path), saver)
    assert "optimizer settings" not in capsys.readouterr().out
    assert t.scheduler.base_lrs == [1e-2, 1e-2]


def test_an_older_checkpoint_without_settings_names_the_lr_from_its_optimizer(tmp_path, capsys):
    saver = _stopped_at_step_3(tmp_path)
    state = saver.latest()
    state.train_record = None  # as written before checkpoints recorded the settings
    t = trainer(tmp_path / "other", config(tmp_path, lr=2e-3), Saver(tmp_path / "other"))
    capsys.readouterr()
    t.resume(state)
    assert "train.lr: 0.01 -> 0.002" in capsys.readouterr().out
    assert t.scheduler.base_lrs == [2e-3, 2e-3]


def test_a_resume_under_another_model_is_refused_naming_the_field(tmp_path):
    saver = _stopped_at_step_3(tmp_path)
    cfg = config(tmp_path)
    wider = cfg.model_copy(update={"model": cfg.model.model_copy(update={"d_model": 32})})
    with pytest.raises(ResumeError, match=r"trained as another model \(model.d_model: 16 -> 32\)"):
        trainer(tmp_path, wider, saver)
    state = saver.latest()
    state.model_record = None  # an older checkpoint: the weights themselves do not fit
    t = trainer(tmp_path / "other", wider, Saver(tmp_path / "other"))
    with pytest.raises(ResumeError, match=r"^the checkpoint's weights do not fit .*size mismatch"):
        t.resume(state)
