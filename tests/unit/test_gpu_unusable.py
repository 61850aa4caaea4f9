"""A rank given a GPU that torch cannot use (an NVIDIA driver older than torch's CUDA: torch then
reports no GPU instead of failing) ends the run at once, in one line that names the fix."""

from __future__ import annotations

import pytest
import torch

from pipeline.train.control import deterministic_cause, is_deterministic
from pipeline.train.loop import GpuUnusableError, check_device


def test_a_gpu_that_torch_cannot_use_is_refused_in_one_line_that_a_retry_would_not_change():
    with pytest.raises(GpuUnusableError) as e:
        check_device(torch.device("cuda", 0), rank=3, cuda_available=False)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("rank 3 was given GPU cuda:0 but torch ")
    assert "580" in msg and "scripts/check_node.sh" in msg
    assert is_deterministic(e.value)  # the failure policy raises it instead of retrying
    wrapped = RuntimeError("worker group failed")
    wrapped.__cause__ = e.value
    assert deterministic_cause(wrapped) is e.value


def test_a_cpu_rank_or_a_usable_gpu_passes():
    check_device(torch.device("cpu"), rank=0, cuda_available=False)
    check_device(torch.device("cuda", 1), rank=1, cuda_available=True)


def test_the_check_runs_on_this_machine_as_the_workers_do():
    """Here torch is a CPU build: a CUDA device is refused, naming the build."""
    if torch.cuda.is_available():
        pytest.skip("a usable GPU is present")
    with pytest.raises(GpuUnusableError, match="torch .* cannot use it"):
        check_device(torch.device("cuda", 0), rank=0)
