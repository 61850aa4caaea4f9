"""A resume under a longer or shorter run (train.max_steps, train.epochs) would recompute the
cosine schedule over the new length and jump the learning rate: it is refused in one line naming
the jump and train.on_schedule_change, on the driver before any worker starts and in the worker;
`keep` continues the checkpoint's schedule, `recompute` takes the new one and says so."""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest

from pipeline.learn.checkpoint import ResumeError
from pipeline.learn.logger import ListLogger
from pipeline.learn.optim import lr_factor
from pipeline.train.resume_check import check_resume_on_driver
from tests.unit.trainer_fixtures import STEPS, Saver, batches_for, config, trainer

# The first run: 6 optimizer steps (one epoch of 6), cosine over 6; the second asks for 12.
FIRST, SECOND = 6, 12


def _finished_short_run(tmp_path):
    saver = Saver(tmp_path)
    t = trainer(tmp_path, config(tmp_path, max_steps=FIRST), saver)
    t.fit(batches_for(), ListLogger())
    assert t.steps_done == FIRST
    return saver, t.history.rows["lr"][FIRST - 1]


def _lr(step, total):
    return 1e-2 * lr_factor(step, warmup=2, total=total, schedule="cosine", min_ratio=0.1)


def test_a_longer_run_is_refused_naming_the_jump_and_the_override(tmp_path):
    saver, _ = _finished_short_run(tmp_path)
    with pytest.raises(ResumeError) as e:
        trainer(tmp_path, config(tmp_path, max_steps=SECOND), saver)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"the LR schedule of the checkpoint ran over {FIRST} optimizer steps" in msg
    assert f"this run is {SECOND}" in msg
    before, after = _lr(FIRST, FIRST), _lr(FIRST, SECOND)
    assert f"from {before:.2e} to {after:.2e} ({after / before:.1f}x)" in msg
    assert "train.on_schedule_change=keep" in msg and "train.on_schedule_change=recompute" in msg


def test_the_driver_refuses_it_before_any_worker_starts(tmp_path):
    saver, _ = _finished_short_run(tmp_path)
    cfg = config(tmp_path, max_steps=SECOND)
    epochs = [{"hash": f"h{e}"} for e in range(2)]
    with pytest.raises(ResumeError, match=r"train.on_schedule_change=keep"):
        check_resume_on_driver(
            cfg, pafs.LocalFileSystem(), str(tmp_path), [0, 16, 32], epochs, None,
            steps_per_epoch=[STEPS, STEPS],
        )  # fmt: skip
    keep = config(tmp_path, max_steps=SECOND, on_schedule_change="keep")
    note = check_resume_on_driver(
        keep, pafs.LocalFileSystem(), str(tmp_path), [0, 16, 32], epochs, None,
        steps_per_epoch=[STEPS, STEPS],
    )  # fmt: skip
    assert f"keeps the checkpoint's LR schedule over {FIRST} optimizer steps" in note
    same = config(tmp_path, max_steps=FIRST)
    assert (
        check_resume_on_driver(
            same,
            pafs.LocalFileSystem(),
            str(tmp_path),
            [0, 16, 32],
            epochs,
            None,
            steps_per_epoch=[STEPS, STEPS],
        )  # fmt: skip
        is None
    )


def test_keep_continues_the_checkpoints_schedule_without_a_jump(tmp_path):
    saver, last = _finished_short_run(tmp_path)
    t = trainer(tmp_path, config(tmp_path, max_steps=SECOND, on_schedule_change="keep"), saver)
    t.fit(batches_for(), ListLogger())
    lrs = t.history.rows["lr"]
    assert lrs[FIRST - 1] == pytest.approx(last)
    # Past the checkpoint's horizon the cosine stays at its floor: no jump up.
    assert lrs[FIRST:SECOND] == pytest.approx([1e-2 * 0.1] * (SECOND - FIRST))
    # The next checkpoint records the kept horizon: resuming again with keep says the same.
    assert saver.latest().train_record["schedule_steps"] == FIRST


def test_recompute_takes_the_new_length_and_says_so(tmp_path, capsys):
    saver, _ = _finished_short_run(tmp_path)
    capsys.readouterr()
    cfg = config(tmp_path, max_steps=SECOND, on_schedule_change="recompute")
    t = trainer(tmp_path, cfg, saver)
    t.fit(batches_for(), ListLogger())
    assert t.history.rows["lr"][FIRST] == pytest.approx(_lr(FIRST, SECOND))
    assert saver.latest().train_record["schedule_steps"] == SECOND
