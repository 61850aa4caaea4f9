"""scripts/check_node.sh, the one-minute GPU node check: its CPU path (gloo between two
processes) runs here, so the script cannot rot on machines without a GPU; exit codes as documented."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_node.sh"


def _run(*args: str, **extra_env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PY": sys.executable, "CHECK_MIB": "1", "CHECK_TIMEOUT_S": "60"}
    env.update(extra_env)
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_cpu_dry_run_prints_versions_and_checks_an_all_reduce():
    res = _run("--cpu")
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert f"torch {torch.__version__}" in out and "torch built with CUDA" in out
    assert "all-reduce gloo 2 ranks 1 MiB: sum correct" in out
    assert out.rstrip().endswith("check_node: OK (gloo)")


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has the GPUs")
def test_without_two_gpus_the_gpu_check_fails_with_its_exit_code():
    res = _run()
    assert res.returncode == 3, res.stdout + res.stderr
    assert "need at least 2 GPUs" in res.stderr


def test_unknown_argument_is_a_usage_error():
    res = _run("--gpu")
    assert res.returncode == 2 and "usage" in res.stderr


def test_a_driver_older_than_torchs_cuda_is_named_with_the_fix(tmp_path):
    """torch built with CUDA 13.0 on a node with driver 570 (CUDA 12.8): torch would report no
    GPU; the check says why. A fake nvidia-smi and a sitecustomize that sets torch's CUDA."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 570.211.01\n")
    smi.chmod(0o755)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import torch\ntorch.version.cuda = '13.0'\n")
    res = _run(
        "--cpu",
        PATH=f"{smi.parent}:{os.environ['PATH']}",
        PYTHONPATH=f"{site}:{os.environ.get('PYTHONPATH', '')}",
    )
    assert res.returncode == 3, res.stdout + res.stderr
    assert "NVIDIA driver 570.211.01" in res.stdout
    assert "needs NVIDIA driver >= 580" in res.stderr and "TORCH_CUDA=cu126" in res.stderr
