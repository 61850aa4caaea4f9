"""The run's picture: a step history written with each checkpoint, drawn into one PNG from a run
directory alone, and `jobs.plot_run` refusing what it cannot draw in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jobs.plot_run import main as plot_run
from pipeline.train.history import HISTORY_FILE, StepHistory, read_history
from pipeline.train.run_picture import PICTURE_FILE, default_picture_path, draw_run, readability

PNG = b"\x89PNG\r\n\x1a\n"


def _history(steps: int = 60, buckets: int = 4, seed: int = 0) -> StepHistory:
    """A falling loss with a fixed offset per bucket (what the debiased curve removes)."""
    rng = np.random.default_rng(seed)
    h = StepHistory()
    for s in range(1, steps + 1):
        b = int(rng.integers(buckets))
        base = 2.0 + 2.0 * np.exp(-s / 15)
        h.append(
            step=s,
            epoch=(s - 1) // 30,
            bucket=b,
            loss=base + 0.4 * b + rng.normal(0, 0.01),
            debiased=base + rng.normal(0, 0.01),
            lr=1e-3,
            real=900.0,
            padded=1000.0,
            seconds=0.1,
        )
    return h


def _run_dir(tmp_path, history: StepHistory | None, steps: int = 60):
    """A run directory with one complete checkpoint, as Ray Train leaves it."""
    ck = tmp_path / "run" / f"checkpoint_step{steps:08d}"
    ck.mkdir(parents=True)
    position = {
        "version": 1,
        "epoch": 1,
        "next_step": 30,
        "plan_hash": "x",
        "world_size": 2,
        "global_batch": {"buckets.edges": [0, 16, 32, 48, 64]},
        "steps_done": steps,
        "data_files": {},
    }
    (ck / "state.json").write_text(json.dumps({"version": 1, "position": position}))
    if history is not None:
        history.write(str(ck))
    return tmp_path / "run"


def test_history_round_trips_and_truncates_to_a_checkpoint(tmp_path):
    h = _history(10)
    h.write(str(tmp_path))
    back = StepHistory.read_dir(str(tmp_path))
    for c, v in h.arrays().items():
        np.testing.assert_array_equal(back.arrays()[c], v)
    import pyarrow.fs as pafs

    assert len(read_history(pafs.LocalFileSystem(), str(tmp_path))) == 10
    back.truncate(4)
    assert back.arrays()["step"].tolist() == [1, 2, 3, 4]
    assert len(StepHistory.read_dir(str(tmp_path / "nothing"))) == 0
    with pytest.raises(ValueError, match="seconds"):
        StepHistory().append(step=1, epoch=0, bucket=0, loss=1, debiased=1, lr=1, real=1, padded=1)


def test_readability_is_below_one_when_the_debiased_curve_removes_bucket_offsets():
    a = _history(200).arrays()
    assert readability(a["loss"], a["debiased"]) < 0.05
    assert np.isnan(readability(np.ones(2), np.ones(2)))


def test_a_run_directory_is_drawn_beside_its_checkpoints(tmp_path):
    run = _run_dir(tmp_path, _history())
    out = draw_run(str(run))
    assert out == str(run / PICTURE_FILE) == default_picture_path(str(run))
    data = (run / PICTURE_FILE).read_bytes()
    assert data.startswith(PNG) and len(data) > 20_000  # five panels and a text block
    assert default_picture_path("s3://bkt/runs/r1").endswith("/r1-run.png")


def test_plot_run_cli_draws_or_refuses_in_one_line(tmp_path, capsys):
    run = _run_dir(tmp_path, _history())
    assert plot_run([str(run), "--out", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").read_bytes().startswith(PNG)
    assert capsys.readouterr().out.strip() == str(tmp_path / "p.png")

    assert plot_run([str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no complete checkpoint" in err and "\n" not in err

    old = _run_dir(tmp_path / "old", None)  # a checkpoint written before runs kept a history
    assert plot_run([str(old)]) == 2
    assert HISTORY_FILE in capsys.readouterr().err


def test_the_text_panel_reads_the_ratio_it_shows():
    from pipeline.train.run_picture import reading_of

    assert reading_of(0.4, 8)[0].startswith("below 1: the raw curve jumps")
    assert reading_of(1.12, 8)[0].startswith("not below 1: in this run the debiased")
    assert reading_of(float("nan"), 8) == ["(too few steps to measure it)"]
    # one bucket (packed rows, sorted-static): the debiased loss is the raw one, ratio 1
    assert reading_of(1.0, 1)[0].startswith("one bucket: no bucket offsets")
    cases = [(0.4, 8), (1.12, 8), (float("nan"), 8), (1.0, 1)]
    assert all(len(line) <= 40 for r, k in cases for line in reading_of(r, k))
