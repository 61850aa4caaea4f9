"""A test session that starts and stops Ray, runs a dataset and logs a W&B run ends with its
summary: nothing after it (no exit-time traceback from Ray's or W&B's exporters, or from Ray
Data's usage poller), so a newcomer's first `make test` does not look broken."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]

INNER = """
import ray
import ray.data
from pipeline.learn.logger import make_logger
from tests.helpers import tiny_config


def test_ray_and_a_wandb_run(tmp_path):
    ray.init(address="local", num_cpus=1, include_dashboard=False)
    assert ray.get(ray.put(1)) == 1
    assert ray.data.range(8).materialize().count() == 8  # Ray Data's usage poller's trigger
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
    assert "Logging error" not in out, out[-3000:]
    assert out.rstrip().splitlines()[-1].startswith("1 passed"), out[-3000:]


def test_a_test_session_starts_no_ray_data_usage_poller():
    """Ray Data's usage poller (a daemon thread polling Prometheus, logging each failure) never
    starts in a test session, whatever datasets the tests run."""
    from ray.data._internal.usage.collector import usage_collection_disabled

    assert os.environ.get("RAY_DATA_USAGE_DISABLED") == "1" and usage_collection_disabled()


def test_without_the_setting_ray_data_would_collect_usage():
    """The setting is what turns it off: a fresh interpreter without it collects (so the test
    above checks something)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_DATA_USAGE_DISABLED"}
    env["RAY_USAGE_STATS_ENABLED"] = "1"
    code = textwrap.dedent(
        """
        from ray.data._internal.usage.collector import usage_collection_disabled
        print(usage_collection_disabled())
        """
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr
