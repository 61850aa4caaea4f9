"""scripts/gpu_smoke.sh --dry: the GPU smoke run's CPU version (2 gloo workers, bf16 off, a few
steps, tiny data, its own local Ray) runs end to end, so the script cannot rot unnoticed. It is
also the suite's run of `python -m jobs.train` as a user starts it: what its console shows is
checked here (the run's own lines only, each once, no error-level line, the picture named last)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.learn.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.ray


@pytest.mark.slow
def test_gpu_smoke_script_dry_mode_trains_and_checkpoints_on_cpu(tmp_path):
    env = {
        **os.environ,
        "PY": sys.executable,
        "SMOKE_OUT": str(tmp_path),
        "WANDB_MODE": "disabled",
        "PYTHONPATH": str(ROOT),
    }
    env.pop("RAY_ADDRESS", None)
    p = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_smoke.sh"), "--dry"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "gpu_smoke: dry run on CPU, 2 gloo workers" in p.stdout
    assert "[bucketray] done: trained 4 global steps" in p.stdout
    assert "gpu_smoke: OK" in p.stdout
    ckpts = sorted((tmp_path / "runs" / "gpu-smoke").glob("checkpoint_step*"))
    state = load_checkpoint(ckpts[-1])
    assert state.position.steps_done == 4 and state.position.world_size == 2
    _assert_quiet_console(p.stdout, p.stderr, tmp_path / "runs" / "gpu-smoke")


# A glog line at error level from Ray's C++ core (`[2026-12-02 01:03:23,841 E 5002 5002] ...`).
_GLOG_ERROR = re.compile(r"^\[[\d-]+ [\d:,]+ E \d+")


def _assert_quiet_console(stdout: str, stderr: str, run_dir: Path) -> None:
    out = [ln for ln in stdout.splitlines() if ln.strip() and not ln.startswith("gpu_smoke:")]
    # stderr: the corpus writer's progress (one line per shard on first use) and nothing else.
    err = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("make_data:")]
    train = out + err
    assert len(train) <= 12, "\n".join(train)
    assert not [ln for ln in train if _GLOG_ERROR.match(ln) or "Traceback" in ln], train
    # No forwarded worker chatter (Ray prefixes it with `(RayTrainWorker pid=...)`) and no
    # Ray Data progress blocks or Ray start-up banner.
    assert not [ln for ln in train if re.match(r"^(\x1b\[\d+m)?\(\w+ pid=", ln)], train
    assert not [ln for ln in train if "Started a local Ray instance" in ln or "Dataset" in ln]
    steps = [ln for ln in train if ln.startswith("[bucketray] step ")]
    assert steps and len(steps) == len(set(steps)), steps  # each progress line once
    picture = run_dir / "run.png"
    assert out[-1] == f"[bucketray] picture of the run: {picture}", out[-3:]
    assert picture.read_bytes().startswith(b"\x89PNG")
