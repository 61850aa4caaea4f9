"""eval.mode=async on a cluster whose training workers hold every GPU: Ray Train would queue each
evaluation task until the worker group shut down (every evaluation after the last step), so the
run is refused in one line naming eval.mode=inline; with room beside the workers, or an
autoscaling cluster, it goes ahead with the resources the task asks for."""

from __future__ import annotations

import pytest

from pipeline.core.config import ConfigError, validate
from pipeline.train.evaluate_run import check_async_room, validation_resources


def _cfg(mode="async", use_gpu=True, workers=8, cpus=4.0):
    return validate(
        {
            "data": {"synthetic": {}},
            "scaling": {"num_workers": workers, "use_gpu": use_gpu, "cpus_per_worker": cpus},
            "eval": {"path": "/tmp/held-out", "mode": mode},
        }
    )


def test_the_task_asks_for_one_workers_cpus_and_with_use_gpu_a_whole_gpu():
    assert validation_resources(_cfg(use_gpu=True).scaling) == {"num_cpus": 4.0, "num_gpus": 1.0}
    assert validation_resources(_cfg(use_gpu=False, cpus=0.5).scaling) == {"num_cpus": 0.5}


def test_every_gpu_held_by_the_workers_refuses_async_naming_inline():
    with pytest.raises(ConfigError) as e:
        check_async_room({"GPU": 8.0, "CPU": 128.0}, _cfg())
    msg = str(e.value)
    assert "\n" not in msg and "eval.mode=inline" in msg
    assert "cluster has 8 GPU" in msg and "after the last training step" in msg


def test_room_beside_the_workers_or_autoscaling_or_inline_goes_ahead():
    check_async_room({"GPU": 9.0, "CPU": 128.0}, _cfg())  # a spare GPU evaluates
    check_async_room({"GPU": 8.0, "CPU": 128.0}, _cfg(), autoscaling=True)
    check_async_room({"GPU": 8.0, "CPU": 128.0}, _cfg(mode="inline"))
    # CPU workers: the task's CPUs beside theirs (the tiny test run: 2 x 0.5 of 2).
    check_async_room({"CPU": 2.0}, _cfg(use_gpu=False, workers=2, cpus=0.5))
    with pytest.raises(ConfigError, match=r"cluster has 8 CPU.*eval.mode=inline"):
        check_async_room({"CPU": 8.0}, _cfg(use_gpu=False, workers=2, cpus=4.0))
