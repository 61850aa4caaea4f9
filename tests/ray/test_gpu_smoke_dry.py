"""scripts/gpu_smoke.sh --dry: the GPU smoke run's CPU version (2 gloo workers, bf16 off, a few
steps, tiny data, its own local Ray) runs end to end, so the script cannot rot unnoticed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.learn.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.ray


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
