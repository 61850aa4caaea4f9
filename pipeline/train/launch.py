"""Driver side of a training run: data, edges and epoch plans on the driver, then TorchTrainer.fit.

Connects to the cluster named by RAY_ADDRESS (set by `ray job submit`) or starts local Ray, builds
the length index and bucket edges once, plans the epochs (for their hashes and `epoch/*`
summaries), starts the data layer's feeder actor and runs `pipeline.train.loop.train_loop` on
`scaling.num_workers` workers. Resubmitting with the same checkpoint.storage_path and run_name
resumes: Ray Train hands the loop its latest checkpoint.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.config import ConfigError, RunConfig
from pipeline.core.metrics import padding_efficiency
from pipeline.core.plan import EpochPlan, steps_per_epoch
from pipeline.core.runlength import run_length
from pipeline.learn.checkpoint import SAVE_FAIL_ENV
from pipeline.train.loop import (
    FAIL_AT_STEP_ENV,
    FAIL_MARKER_ENV,
    FAIL_RANK_ENV,
    LoopInputs,
    train_loop,
)

__all__ = ["TrainSummary", "epoch_metrics", "storage_path", "run_dir", "run"]

# Environment forwarded from the driver to the workers: W&B mode (never the key) and the
# fault-injection knobs tests use. A cluster provides WANDB_API_KEY to its workers itself.
FORWARDED_ENV = ("WANDB_MODE", FAIL_AT_STEP_ENV, FAIL_MARKER_ENV, FAIL_RANK_ENV, SAVE_FAIL_ENV)


@dataclass(frozen=True)
class TrainSummary:
    steps: int
    tokens: int
    samples: int
    loss: float
    padding_efficiency: float
    checkpoint: str | None
    seconds: float

    def __str__(self) -> str:
        return (
            f"trained {self.steps} global steps, {self.samples:,} samples, {self.tokens:,} real tokens "
            f"in {self.seconds:.0f} s | final loss {self.loss:.4f} | padding efficiency "
            f"{self.padding_efficiency:.3f} | checkpoint {self.checkpoint}"
        )


def storage_path(cfg: RunConfig) -> str:
    """checkpoint.storage_path, made absolute when it is a local path (Ray Train needs that)."""
    p = cfg.checkpoint.storage_path
    return p if "://" in p else os.path.abspath(os.path.expanduser(p))


def _storage(cfg: RunConfig):
    """(storage_path, storage_filesystem) for Ray Train's RunConfig.

    A URI is resolved here, on the driver: Ray Train's controller would otherwise resolve it
    from its own environment, so an endpoint set only for the job's driver (AWS_ENDPOINT_URL)
    would not reach it. The filesystem carries the endpoint, never the credentials.
    """
    from pipeline.data.index import filesystem_for

    p = storage_path(cfg)
    if "://" not in p:
        return p, None
    fs, path = filesystem_for(p)
    return path, fs


def _checkpoint_uri(checkpoint) -> str | None:
    """Where a Ray Train checkpoint lives, with the scheme Ray strips from its path (s3://...)."""
    if checkpoint is None:
        return None
    fs = checkpoint.filesystem
    if fs is None or fs.type_name == "local":
        return checkpoint.path
    return f"{fs.type_name}://{checkpoint.path}"


def run_dir(cfg: RunConfig) -> str:
    return f"{storage_path(cfg).rstrip('/')}/{cfg.checkpoint.run_name}"


def epoch_metrics(plan: EpochPlan, edges: list[int], pad_to_multiple_of: int) -> dict:
    """`epoch/*` metrics: steps, samples and tokens per bucket, planned padding efficiency, hash."""
    s = plan.summary()
    lens, offsets = plan.micro_batch_lengths()
    cap = np.asarray(edges)[1:][plan.micro_batch_buckets()]
    out = {
        "epoch/steps": s["steps"],
        "epoch/samples": s["samples"],
        "epoch/tokens": s["tokens"],
        "epoch/planned_padding_efficiency": padding_efficiency(
            lens, offsets, multiple=pad_to_multiple_of, cap=cap
        ),
        "epoch/plan_hash": s["hash"],
    }
    for name in ("steps", "samples", "tokens"):
        for k, v in enumerate(s[f"{name}_per_bucket"]):
            out[f"epoch/{name}_per_bucket/{k}"] = int(v)
    return out


def _init_ray() -> None:
    import ray

    if not ray.is_initialized():
        # With RAY_ADDRESS set (ray job submit does) this connects; otherwise it starts local Ray.
        ray.init(address=os.environ.get("RAY_ADDRESS") or None)


def run(cfg: RunConfig) -> TrainSummary:
    """Prepare data, train to the end of the configured run, return the final summary."""
    import ray
    import ray.train
    from ray.train.torch import TorchTrainer

    from pipeline.data import (
        build_length_index,
        epoch_plan_for,
        resolve_data_path,
        resolve_edges,
        start_feeder,
    )

    t0 = time.perf_counter()
    _init_ray()
    world = cfg.scaling.num_workers

    path = resolve_data_path(cfg)
    index = build_length_index(cfg, path)
    edges = [int(e) for e in resolve_edges(cfg, index.lengths)]
    S = steps_per_epoch(index.lengths, edges, cfg.batching)
    if S == 0:
        raise ConfigError(
            f"no training steps: {len(index.lengths)} valid samples under buckets {edges} "
            "(with batching.drop_remainder, every bucket may be smaller than one global batch)"
        )
    length = run_length(S, cfg.train)
    total = length.global_steps
    epochs = []
    for e in range(length.epochs):
        plan = epoch_plan_for(cfg, index, edges, e, world)
        epochs.append(
            {
                "hash": plan.content_hash,
                "metrics": epoch_metrics(plan, edges, cfg.batching.pad_to_multiple_of),
            }
        )
    print(
        f"[bucketray] {len(index.lengths):,} samples, edges {edges}, {S} steps/epoch, "
        f"{total} steps on {world} workers -> {run_dir(cfg)}",
        flush=True,
    )

    feeder_name = f"bucketray-feeder-{cfg.checkpoint.run_name}-{uuid.uuid4().hex[:8]}"
    feeder = start_feeder(cfg, index, edges, name=feeder_name, path=path)
    wandb_dir = cfg.wandb.dir or (run_dir(cfg) if "://" not in run_dir(cfg) else "wandb")
    inputs = LoopInputs(
        cfg=cfg.model_dump(mode="json"),
        feeder=feeder_name,
        edges=edges,
        steps_per_epoch=S,
        epochs=epochs,
        wandb_dir=str(Path(wandb_dir).absolute()) if "://" not in wandb_dir else "wandb",
    )
    resources = {**cfg.scaling.resources_per_worker, "CPU": cfg.scaling.cpus_per_worker}
    if cfg.scaling.use_gpu:
        resources["GPU"] = 1
    train_storage_path, train_storage_fs = _storage(cfg)
    trainer = TorchTrainer(
        train_loop,
        train_loop_config=inputs.to_dict(),
        scaling_config=ray.train.ScalingConfig(
            num_workers=cfg.scaling.ray_num_workers(),
            use_gpu=cfg.scaling.use_gpu,
            resources_per_worker=resources,
        ),
        run_config=ray.train.RunConfig(
            name=cfg.checkpoint.run_name,
            storage_path=train_storage_path,
            storage_filesystem=train_storage_fs,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.checkpoint.keep_last),
            failure_config=ray.train.FailureConfig(max_failures=cfg.checkpoint.max_failures),
            worker_runtime_env={
                "env_vars": {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
            },
        ),
    )
    try:
        result = trainer.fit()
    finally:
        ray.kill(feeder)
    m = result.metrics or {}
    return TrainSummary(
        steps=int(m.get("steps", 0)),
        tokens=int(m.get("tokens", 0)),
        samples=int(m.get("samples", 0)),
        loss=float(m.get("loss", float("nan"))),
        padding_efficiency=float(m.get("padding_efficiency", float("nan"))),
        checkpoint=_checkpoint_uri(result.checkpoint),
        seconds=time.perf_counter() - t0,
    )
