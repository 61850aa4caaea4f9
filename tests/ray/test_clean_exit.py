"""A test session that starts and stops Ray and logs a W&B run ends with its summary: nothing
after it (no exit-time traceback from Ray's or W&B's exporters), so a newcomer's first
`make test` does not look broken."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]

INNER = """
import ray
from pipeline.learn.logger import make_logger
from tests.helpers import tiny_config


def test_ray_and_a_wandb_run(tmp_path):
    ray.init(address="local", num_cpus=1, include_dashboard=False)
    assert ray.get(ray.put(1)) == 1
    ray.shutdown()
    lg = make_logger(tiny_config(tmp_path, wandb={"mode": "offline"}), rank=0, run_id="clean",
                     wandb_dir=str(tmp_path))
    lg.log({"train/loss": 1.0}, step=1)
    lg.finish()
"""


def test_a_session_with_ray_and_wandb_exits_without_a_traceback(tmp_path):
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "WANDB_MODE")}
    env["PYTHONPATH"] = str(REPO)
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider"]
        + ["--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert "1 passed" in p.stdout
    assert "Traceback" not in out and "cannot schedule new futures" not in out, out[-3000:]
    assert out.rstrip().splitlines()[-1].startswith("1 passed"), out[-3000:]
