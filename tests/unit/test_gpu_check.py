"""scripts/gpu_check.sh, the GPU check a lent GPU machine runs in one command: its CPU path runs
here (GPU tests collected and skipped, the step benchmark at tiny sizes, its goals table), so
the script cannot rot before a GPU is lent; exit codes as documented."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _run(*args: str, **extra_env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PY": sys.executable, **extra_env}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_gpu_check_cpu_path_runs_the_gpu_tests_and_the_step_benchmark(tmp_path):
    res = _run("--cpu", OUT_DIR=str(tmp_path))
    out = res.stdout
    assert res.returncode == 0, out + res.stderr
    assert f"torch {torch.__version__}" in out
    assert "skipped" in out  # tests/gpu collected (imports hold) and skipped without a GPU
    r = json.loads((tmp_path / "gpu.json").read_text())
    assert r["setup"]["tiny"] is True and r["meta"]["command"].startswith("python -m bench.gpu")
    for model in ("llama_1b", "tiny_decoder_1b"):
        pol = r["models"][model]["policies"]
        assert set(pol) == {"packed", "auto", "sorted", "random"}
        for name, v in pol.items():
            assert v["real_tokens_per_s"] > 0 and 0 < v["fill"] <= 1, (model, name, v)
            assert 0 <= v["wait_fraction"] < 1
        # packed rows fill their slots; random padding wastes about half of them
        assert pol["packed"]["fill"] > 0.95 > pol["auto"]["fill"] - 0.04 > pol["random"]["fill"]
        assert set(r["models"][model]["packed_vs"]) == {"auto", "sorted", "random"}
    assert "| goal | target | measured | met |" in out
    assert out.rstrip().endswith("gpu_check: OK (cpu)")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_the_gpu_check_fails_with_its_exit_code(tmp_path):
    res = _run(OUT_DIR=str(tmp_path))
    assert res.returncode == 3, res.stdout + res.stderr
    assert "torch sees no CUDA GPU" in res.stderr and "--cpu" in res.stderr


def test_a_missing_package_is_named_with_the_way_to_carry_it(tmp_path):
    shadow = tmp_path / "shadow"
    (shadow / "pydantic").mkdir(parents=True)
    (shadow / "pydantic" / "__init__.py").write_text("raise ImportError('not installed')\n")
    res = _run("--cpu", OUT_DIR=str(tmp_path), PYTHONPATH=str(shadow), WHEEL_DIR=str(tmp_path))
    assert res.returncode == 4, res.stdout + res.stderr
    assert "missing Python packages ['pydantic']" in res.stderr and "--fetch-wheels" in res.stderr


def test_usage_error_exits_2():
    res = _run("--nope")
    assert res.returncode == 2 and "usage" in res.stderr
