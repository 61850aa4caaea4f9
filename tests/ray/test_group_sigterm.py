"""SIGTERM to the whole process group of `python -m jobs.train` (GNU timeout, `kill -TERM -PGID`,
Slurm's scancel, a container stop) stops the run like a SIGTERM to the driver alone: after the
current step, with a checkpoint Ray Train registers, the run lease released, exit 0. The private
Ray instance's processes live outside the driver's group, so the signal does not kill the GCS
under the stopping driver; they still end with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import tiny_raw

pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def _descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc: psutil is not a project dependency)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def _alive(pids: set[int]) -> set[int]:
    out = set()
    for p in pids:
        try:
            state = (Path("/proc") / str(p) / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.add(p)
    return out


def test_sigterm_to_the_whole_group_stops_the_run_with_a_registered_checkpoint(tmp_path):
    raw = tiny_raw(
        tmp_path,
        train={"epochs": 50, "log_every": 1},
        checkpoint={"run_name": "group", "every_steps": 1000},
    )
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(raw))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["WANDB_MODE"] = "disabled"
    log = tmp_path / "train.log"
    job = subprocess.Popen(
        [sys.executable, "-m", "jobs.train", "--config", str(tmp_path / "run.yaml")],
        cwd=REPO,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a group of its own, as under timeout or a scheduler
    )
    try:
        deadline = time.monotonic() + 300
        while "[bucketray] step 3/" not in log.read_text():
            assert job.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        ray_processes = _descendants(job.pid)
        os.killpg(job.pid, signal.SIGTERM)
        code = job.wait(timeout=240)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    out = log.read_text()
    assert code == 0, out[-4000:]
    assert "stopping after the current step with a checkpoint" in out
    assert "Failed to connect to GCS" not in out and "Traceback" not in out, out[-4000:]
    run_dir = tmp_path / "runs" / "group"
    assert not (run_dir / "RUN_LEASE.json").exists()
    # The stop's checkpoint is the run's latest, and Ray Train registered it: a resubmitted job
    # restores from it.
    stopped = sorted(run_dir.glob("checkpoint_step*"))[-1]
    steps = json.loads((stopped / "state.json").read_text())["position"]["steps_done"]
    assert steps >= 3
    snapshots = list(run_dir.glob("checkpoint_manager_snapshot*.json"))
    assert snapshots and stopped.name in snapshots[0].read_text()
    # Nothing of the run's private Ray outlives the driver.
    deadline = time.monotonic() + 30
    while _alive(ray_processes) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _alive(ray_processes), "processes of the run's Ray survived the driver"
