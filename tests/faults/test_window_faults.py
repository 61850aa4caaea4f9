"""Contract 7 on a windowed epoch: a training worker SIGKILLed inside the second of three windows
(`plan.window_tokens`, no row cache, no lead-in: each window one Ray Data pass over its own row
groups, the carried rows held between passes) resumes from its checkpoint inside that window, and
the rest of the epoch is the uninterrupted windowed run's, sample for sample."""

from __future__ import annotations

import time

import pytest

from pipeline.data import build_length_index, epoch_plan_for, resolve_edges
from pipeline.train.launch import run
from tests.faults.conftest import (
    WINDOW_KILL_AFTER,
    WINDOWED,
    assert_exact_recovery,
    attempts,
    fault_config,
    kill_when,
    read_records,
    report,
)

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_windows_sigkilled_worker_resumes_inside_its_window_exact_batches(
    local_ray, window_reference, window_data, tmp_path
):
    cfg = fault_config(window_data, tmp_path, "window-sigkill", *WINDOWED)
    index = build_length_index(cfg)
    plan = epoch_plan_for(cfg, index, resolve_edges(cfg, index.lengths), 0, 2)
    ws = plan.window_steps
    assert ws.size - 1 == 3 and ws[1] < 30 < ws[2], ws  # resumed inside the second window
    watcher, info = kill_when(tmp_path / "ids", after_steps=WINDOW_KILL_AFTER, rank=1)
    t0 = time.monotonic()
    summary = run(cfg)
    seconds = time.monotonic() - t0
    watcher.join(timeout=60)

    steps = window_reference["summary"].steps
    assert steps == plan.num_steps
    assert "pid" in info and info["steps_at_kill"] < steps, info  # killed mid-epoch
    recs = read_records(tmp_path / "ids")
    rec = assert_exact_recovery(recs, window_reference["records"])
    assert rec.attempts == 2 and ws[1] < rec.resumed_at < ws[2], (rec.resumed_at, ws)
    assert all(a[0]["pid"] != info["pid"] for a in attempts(recs, 1)[1:])  # a new process
    assert summary.steps == steps and summary.samples == window_reference["summary"].samples
    report(
        "sigkill_worker_windowed",
        windows=ws.tolist(),
        killed_after=info["steps_at_kill"],
        resumed_at=rec.resumed_at,
        rerun_steps=rec.rerun_steps,
        fit_s=round(seconds, 1),
        reference_fit_s=round(window_reference["seconds"], 1),
    )
