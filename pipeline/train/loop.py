"""The Ray Train worker loop: Ray's context, the data layer and `ray.train.report` around a Trainer.

The training itself (resume, step, logging, checkpoints, exact resume: contract 7) lives in
`pipeline.train.trainer`, which has no Ray in it; this module only wires it to the run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial

from pipeline.core.config import RunConfig
from pipeline.data.run_warnings import forward_warnings, warning_counts
from pipeline.learn.checkpoint import CheckpointStorageError, checkpoint_files, load_checkpoint
from pipeline.learn.logger import MetricLogger, log_summary, make_logger
from pipeline.train.faults import FAIL_AT_STEP_ENV, FAIL_MARKER_ENV, FAIL_RANK_ENV
from pipeline.train.history import EvalHistory, StepHistory
from pipeline.train.progress import SampleRecorder
from pipeline.train.runspec import RunSpec
from pipeline.train.step import GroupStats, train_group
from pipeline.train.stop import stop_flag_name, stop_poller
from pipeline.train.trainer import Trainer

__all__ = [
    "EXPANDABLE_SEGMENTS",
    "GpuUnusableError",
    "LoopInputs",
    "allocator_setting",
    "check_device",
    "GroupStats",
    "train_loop",
    "train_group",
    "use_allocator_setting",
    "FAIL_AT_STEP_ENV",
    "FAIL_MARKER_ENV",
    "FAIL_RANK_ENV",
]


@dataclass(frozen=True)
class LoopInputs:
    """What the driver hands every worker (as train_loop_config, a plain dict)."""

    cfg: dict  # RunConfig.model_dump(mode="json"); re-validated in the worker
    feeder: str  # name of the data layer's feeder actor
    edges: list[int]
    steps_per_epoch: list[int]  # planned global steps of each epoch the run reaches
    epochs: list[dict]  # per epoch: {"hash": plan hash, "metrics": {"epoch/...": ...}}
    wandb_dir: str
    data_files: dict = field(default_factory=dict)  # per-shard digests (pipeline.core.manifest)
    warnings: str | None = None  # the run's warning collector (pipeline.data.run_warnings)
    # [ObjectRef of the held-out EvalSet] (a list: Ray does not dereference it); [] without eval
    eval_set: list = field(default_factory=list)
    ranges: list = field(default_factory=list)  # the loss's length ranges (core.length_ranges)
    reference: dict = field(default_factory=dict)  # eval.reference_run's held-out curve

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class WarningsInSummary:
    """The run's logger, whose finish first writes every warning of the run (the collector's
    texts with their counts and processes) into the run's summary (rank 0 only)."""

    def __init__(self, inner: MetricLogger, collector: str | None):
        self.inner, self.collector = inner, collector

    def log(self, metrics: dict, step: int) -> None:
        self.inner.log(metrics, step)

    def finish(self) -> None:
        found = warning_counts(self.collector)
        if found:
            log_summary(self.inner, {"warnings": found, "warnings/count": len(found)})
        self.inner.finish()


def _report(
    directory: str,
    metrics: dict,
    name: str,
    *,
    storage_path: str = "",
    validation: dict | None = None,
) -> None:
    """Report `metrics` with the checkpoint in `directory` (Ray Train copies it to the run's
    storage as `name`); with `validation` (eval.mode=async), Ray Train evaluates it in a task of
    its own, `validation` as the task's keyword arguments. A write that storage refuses for good
    (disk full, read-only, permission) removes the partial copy -- nothing a resume could take
    for a checkpoint -- and ends the run naming checkpoint.storage_path."""
    import ray.train

    from pipeline.train.control import is_permanent_os_error

    extra = {}
    if validation is not None:
        from ray.train.v2.api.validation_config import ValidationTaskConfig

        extra["validation"] = ValidationTaskConfig(fn_kwargs=validation)
    try:
        ray.train.report(
            metrics,
            checkpoint=ray.train.Checkpoint.from_directory(directory),
            checkpoint_dir_name=name,
            **extra,
        )
    except OSError as e:
        if not is_permanent_os_error(e):
            raise
        _remove_partial_checkpoint(name)
        raise CheckpointStorageError(
            f"checkpoint.storage_path={storage_path}: cannot write checkpoint {name} "
            f"({' '.join(str(e).split())}); the partial copy was removed: free space or choose "
            "a writable checkpoint.storage_path, then resubmit to resume from the last "
            "complete checkpoint"
        ) from e


def _remove_partial_checkpoint(name: str) -> None:
    import ray.train

    storage = ray.train.get_context().get_storage()
    try:  # every rank may try: the first one removes it
        storage.storage_filesystem.delete_dir(storage.build_checkpoint_path_from_name(name))
    except OSError:
        pass


class GpuUnusableError(RuntimeError):
    """Ray gave a rank a GPU that torch cannot use: the same on every retry on that node."""

    retryable = False  # pipeline.train.control ends the run at once with this one line


def check_device(device, rank: int, *, cuda_available=None) -> None:
    """Refuse a CUDA device torch cannot reach (a driver older than the CUDA torch was built
    with: torch then reports no GPU rather than failing), naming both versions and the fix."""
    import torch

    available = torch.cuda.is_available() if cuda_available is None else cuda_available
    if device.type != "cuda" or available:
        return
    raise GpuUnusableError(
        f"rank {rank} was given GPU {device} but torch {torch.__version__} (built with CUDA "
        f"{torch.version.cuda or 'none: a CPU build'}) cannot use it: torch.cuda.is_available() "
        "is False. The NVIDIA driver is likely older than that CUDA needs (CUDA 13.x: driver "
        ">= 580; 12.x: >= 525.60.13) or the torch build has no CUDA; run scripts/check_node.sh "
        "in the image on that node (docs/cluster.md, CUDA: which version matters)"
    )


# The CUDA caching allocator's setting for padded batches: each bucket's shape leaves cached
# blocks of its own size, which expandable segments grow into instead of reserving more.
EXPANDABLE_SEGMENTS = "expandable_segments:True"
_ALLOC_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def allocator_setting(environ: Mapping[str, str], *, packed: bool) -> str | None:
    """The allocator setting a worker applies: expandable segments for padded batches; None
    with packed rows (one shape every step) or when the user set PYTORCH_CUDA_ALLOC_CONF or
    PYTORCH_ALLOC_CONF (never overridden)."""
    if packed or any(k in environ for k in _ALLOC_ENV):
        return None
    return EXPANDABLE_SEGMENTS


def use_allocator_setting(cfg: RunConfig, device) -> None:
    """Apply `allocator_setting` to this CUDA worker, before the model takes any memory."""
    setting = allocator_setting(os.environ, packed=cfg.batching.mode == "packed")
    if setting is None or device.type != "cuda":
        return
    import torch

    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = setting  # read by processes this worker starts
    # Ray Train set this worker's CUDA device (so initialised CUDA, reading the environment)
    # before the loop runs: the running allocator takes the setting too, for its new segments.
    apply = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    (apply or torch.cuda.memory._set_allocator_settings)(setting)


def train_loop(config: dict) -> None:
    """Ray Train's train_loop_per_worker. `config` is LoopInputs.to_dict()."""
    import ray.train
    import ray.train.torch

    from pipeline.data import rank_batches  # the Ray Data layer; imported on the worker

    inp = LoopInputs(**config)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    forward_warnings(inp.warnings, f"rank {rank}")  # to the driver's console, once each
    cfg = RunConfig.model_validate(inp.cfg)
    device = ray.train.torch.get_device()
    check_device(device, rank)
    use_allocator_setting(cfg, device)
    spec = RunSpec(
        rank=rank,
        world=world,
        device=device,
        edges=inp.edges,
        steps_per_epoch=inp.steps_per_epoch,
        epochs=inp.epochs,
        run_dir=ctx.get_storage().experiment_fs_path,
        data_files=inp.data_files,
        ranges=list(inp.ranges),
        reference=dict(inp.reference),
    )
    # Rank 0 asks the driver's stop flag; every rank joins the all-reduce that makes it unanimous.
    stop = stop_poller(stop_flag_name(cfg.checkpoint.run_name)) if rank == 0 else (lambda: False)
    eval_batches = None
    if cfg.eval is not None and cfg.eval.mode == "inline" and inp.eval_set:
        from pipeline.data.evalset import rank_eval_batches

        held_out = ray.get(inp.eval_set[0])
        eval_batches = rank_eval_batches(
            cfg, held_out, top=inp.edges[-1], rank=rank, world_size=world
        )
    trainer = Trainer(
        cfg,
        spec,
        save=partial(_report, storage_path=cfg.checkpoint.storage_path),
        recorder=SampleRecorder(cfg.train.record_sample_ids, rank),
        stop=stop,
        eval_batches=eval_batches,
    )
    ckpt = ray.train.get_checkpoint()
    if ckpt is not None:
        with checkpoint_files(ckpt) as d:
            state = load_checkpoint(d, rank=rank)
            trainer.resume(state, StepHistory.read_dir(d), EvalHistory.read_dir(d))
    else:
        trainer.resume(None)
    logger = WarningsInSummary(
        make_logger(
            cfg,
            rank=rank,
            run_id=trainer.run_id,
            wandb_dir=inp.wandb_dir,
            metrics_file=cfg.train.metrics_file,
        ),
        inp.warnings if rank == 0 else None,
    )

    def batches(epoch: int, start_step: int):
        return rank_batches(
            inp.feeder,
            epoch=epoch,
            start_step=start_step,
            rank=rank,
            world_size=world,
            pin_memory=device.type == "cuda",
            plan_hash=inp.epochs[epoch]["hash"],  # the feeder must serve the plan we trained on
        )

    trainer.fit(batches, logger)
