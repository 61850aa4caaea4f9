"""What `check_async_room` relies on, in Ray Train itself (2.60): a validation task that asks for
a GPU runs while training goes on when a GPU is free beside the workers, and only after the
worker group shut down when the workers hold every GPU. Ray's GPUs are declared here (no CUDA
is used), the workers are bare Ray Train workers (no torch process group)."""

from __future__ import annotations

import tempfile
import time
from functools import partial
from pathlib import Path

import pytest

from tests.ray.conftest import private_ray

# Two private Ray sessions and Ray Train runs (about a minute): Ray's own behaviour, checked with
# the slow suite.
pytestmark = [pytest.mark.ray, pytest.mark.slow]

STEPS, STEP_S = 6, 1.0


def _validated_before_training_ended(gpus: int, tmp: Path) -> bool:
    import ray.train
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
    from ray.train.v2.api.validation_config import ValidationConfig

    from pipeline.core.config import validate
    from pipeline.train.evaluate_run import validation_resources

    # Defined here, so that Ray pickles them by value (workers cannot import a test module).
    def _train(config: dict) -> None:
        import ray.train

        rank = ray.train.get_context().get_world_rank()
        for i in range(STEPS):
            time.sleep(STEP_S)
            with tempfile.TemporaryDirectory() as d:
                Path(d, "x").write_text(str(i))
                ray.train.report(
                    {"i": i},
                    checkpoint=ray.train.Checkpoint.from_directory(d) if rank == 0 else None,
                    validation=i == 0 and rank == 0,
                )
        if rank == 0:
            Path(config["out"], "train_end").write_text(str(time.time()))

    def _validate(checkpoint, out: str) -> dict:
        Path(out, "validated").write_text(str(time.time()))
        return {"ok": 1}

    out = tmp / f"gpus{gpus}"
    out.mkdir()
    scaling = validate(
        {"data": {"synthetic": {}}, "scaling": {"use_gpu": True, "cpus_per_worker": 0.25}}
    ).scaling
    with private_ray(num_gpus=gpus):
        DataParallelTrainer(
            _train,
            train_loop_config={"out": str(out)},
            validation_config=ValidationConfig(
                fn=partial(_validate, out=str(out)),
                ray_remote_kwargs=validation_resources(scaling),
            ),
            scaling_config=ray.train.ScalingConfig(
                num_workers=2, use_gpu=True, resources_per_worker={"CPU": 0.25, "GPU": 1}
            ),
            run_config=ray.train.RunConfig(name=f"room{gpus}", storage_path=str(tmp / "runs")),
        ).fit()
    return float((out / "validated").read_text()) < float((out / "train_end").read_text())


def test_a_gpu_validation_task_runs_during_training_only_with_a_gpu_beside_the_workers(tmp_path):
    assert _validated_before_training_ended(3, tmp_path)  # a spare GPU
    assert not _validated_before_training_ended(2, tmp_path)  # every GPU held: after the end
