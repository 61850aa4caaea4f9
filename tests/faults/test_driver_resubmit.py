"""Contract 7 when the driver dies: `python -m jobs.train` killed mid-epoch (SIGKILL to its whole
process group: driver, its local Ray, workers) and the same command run again with the same
checkpoint.run_name resumes from the last checkpoint, with the same W&B run id and exactly the
uninterrupted run's batches; the W&B key in its environment is written nowhere."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.faults.conftest import (
    BASE_CONFIG,
    REPO,
    FaultCase,
    assert_exact_recovery,
    attempts,
    fault_overrides,
    kill_when,
    read_records,
    report,
)

pytestmark = [pytest.mark.ray, pytest.mark.slow]

# A fake key: W&B runs offline here, so it is never sent anywhere, only searched for afterwards.
SECRET = "bucketray-test-secret-0123456789abcdef0123"


def _job(case: FaultCase, tmp: Path, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "jobs.train", "--config", str(BASE_CONFIG)]
    for o in fault_overrides(case.data, tmp, "resubmitted", "wandb.mode=offline", *case.extra):
        cmd += ["--set", o]
    env = {
        **os.environ,
        "RAY_ADDRESS": "local",  # its own local Ray, never another cluster on this machine
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_API_KEY": SECRET,
    }
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so the kill takes all of it
    )


def _group_alive(pgid: int) -> list[int]:
    """Pids still in process group `pgid` (from /proc: psutil is not a project dependency)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # field 5 of stat: pgrp
            out.append(int(stat.parent.name))
    return out


def test_contract7_killed_driver_resubmitted_resumes_same_wandb_run_exact_batches(
    fault_case, tmp_path
):
    """Global and windowed (killed, and resumed by a fresh feeder holding no carried rows,
    inside the second window)."""
    case, reference = fault_case, fault_case.reference
    first = _job(case, tmp_path, tmp_path / "first.log")
    pgid = first.pid
    watcher, info = kill_when(
        tmp_path / "ids",
        after_steps=case.kill_after,
        rank=0,
        kill=lambda _: os.killpg(pgid, signal.SIGKILL),
    )
    # Only the kill: the watcher's wait for a recovery ends with the second job, not before.
    deadline = time.monotonic() + 600
    while "t" not in info and watcher.is_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    first.wait(timeout=60)
    assert "t" in info and first.returncode == -signal.SIGKILL, (tmp_path / "first.log").read_text()
    deadline = time.monotonic() + 30
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _group_alive(pgid), "processes of the killed job survived"
    killed_at = info["steps_at_kill"]

    t0 = time.monotonic()
    second = _job(case, tmp_path, tmp_path / "second.log")
    assert second.wait(timeout=900) == 0, (tmp_path / "second.log").read_text()[-4000:]
    resubmit_s = time.monotonic() - t0
    out = (tmp_path / "second.log").read_text()

    recs = read_records(tmp_path / "ids")
    rec = assert_exact_recovery(recs, reference["records"])
    assert rec.attempts == 2 and rec.resumed_at <= killed_at
    assert f"resuming at epoch 0 step {rec.resumed_at}" in out
    assert f"trained {reference['summary'].steps} global steps" in out
    assert attempts(recs, 0)[1][0]["pid"] != attempts(recs, 0)[0][0]["pid"]
    case.assert_inside_a_later_window(killed_at)  # the driver killed there
    case.assert_inside_a_later_window(rec.resumed_at)  # and the resubmitted run resumed there

    # The same W&B run: both attempts' offline runs carry the id stored in the checkpoints.
    run_dir = tmp_path / "runs" / "resubmitted"
    last = sorted(run_dir.glob("checkpoint_step*"))[-1]
    run_id = json.loads((last / "state.json").read_text())["wandb_run_id"]
    offline = sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 2 and all(p.endswith(f"-{run_id}") for p in offline), offline

    # The key is in the environment only: not in any log, config, W&B file or checkpoint.
    leaks = [
        str(p) for p in tmp_path.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()
    ]
    assert not leaks, leaks
    report(
        "driver_killed_resubmitted" + ("_windowed" if case.windowed else ""),
        killed_after=killed_at,
        resumed_at=rec.resumed_at,
        rerun_steps=rec.rerun_steps,
        resubmit_to_end_s=round(resubmit_s, 1),
        wandb_run_id=run_id,
        files_scanned=sum(1 for p in tmp_path.rglob("*") if p.is_file()),
    )
