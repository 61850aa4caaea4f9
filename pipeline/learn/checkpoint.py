"""Training state to and from a checkpoint directory, with a versioned data position for resume.

Layout (one directory; Ray Train merges what each rank wrote):
    model.pt, optimizer.pt, trainer.pt   rank 0: weights, AdamW state, scheduler/tracker/counters
    rng_rank<r>.pt                        every rank: its torch / python / numpy RNG states
    run_config.json                       rank 0: the run's config (jobs.evaluate reads it)
    state.json                            rank 0, written last: {"version": 1, "position": ...,
                                          "model": the model's record, "train": the optimizer
                                          settings} (pipeline.learn.model_record, resume_settings)
A directory without state.json is an incomplete checkpoint and is refused. Tensors are loaded
with `torch.load(weights_only=True)`: a checkpoint cannot run code.

Resume (contract 7): after global step s of epoch e the position says (epoch=e, next_step=s+1);
the loop asks the data layer for epoch e from step s+1 on, so no skipped data is read.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.core.config import RunConfig
from pipeline.core.manifest import describe_changes
from pipeline.learn.loss import assert_finite_weights

__all__ = [
    "POSITION_VERSION",
    "RUN_CONFIG_FILE",
    "SAVE_FAIL_ENV",
    "CheckpointError",
    "CheckpointStorageError",
    "ResumeError",
    "DataPosition",
    "TrainState",
    "global_batch_definition",
    "save_checkpoint",
    "save_run_config",
    "load_checkpoint",
    "checkpoint_files",
    "load_run_config",
    "check_resume",
    "rng_state",
    "set_rng_state",
]

POSITION_VERSION = 1
STATE_FILE = "state.json"
RUN_CONFIG_FILE = "run_config.json"
# Fault injection for tests: rank 0 SIGKILLs itself between model.pt and optimizer.pt while
# saving the checkpoint of global step N, once (marked by "<BUCKETRAY_FAIL_MARKER>.save").
SAVE_FAIL_ENV = "BUCKETRAY_DIE_SAVING_STEP"


class CheckpointError(RuntimeError):
    """A checkpoint directory that cannot be read: incomplete, or from another format version."""


class CheckpointStorageError(CheckpointError):
    """A checkpoint that cannot be written (disk full, read-only, permission denied): the same
    write fails on every retry, so the run ends naming checkpoint.storage_path."""


class ResumeError(RuntimeError):
    """A checkpoint that cannot continue under this config without changing the sample order."""


@dataclass(frozen=True)
class DataPosition:
    """Where the data stream stands: the next global step to train, and what defines the batches."""

    epoch: int
    next_step: int  # first global step of `epoch` not yet trained
    plan_hash: str  # EpochPlan.content_hash of `epoch` (world-size independent)
    world_size: int
    global_batch: dict  # global_batch_definition(): what makes the global batches what they are
    steps_done: int  # global steps trained in the whole run
    # Per shard (relative to the data path): digest of its samples' ids and lengths
    # (pipeline.core.manifest), so a refused resume names the shards that changed.
    data_files: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"version": POSITION_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict) -> DataPosition:
        version = d.get("version")
        if version != POSITION_VERSION:
            raise CheckpointError(
                f"data position version {version!r} is not supported (this code reads version "
                f"{POSITION_VERSION}); resume with the bucketray version that wrote it"
            )
        return cls(**{k: v for k, v in d.items() if k != "version"})

    def normalized(self, steps_per_epoch: int) -> DataPosition:
        """The same position with a finished epoch rolled over to (epoch + 1, step 0)."""
        if self.next_step < steps_per_epoch:
            return self
        return DataPosition(**{**asdict(self), "epoch": self.epoch + 1, "next_step": 0})


@dataclass
class TrainState:
    """Everything a restart needs; `rng` is this rank's own RNG state (None if it has none)."""

    model: dict
    optimizer: dict
    scheduler: dict
    position: DataPosition
    wandb_run_id: str
    counters: dict = field(default_factory=dict)  # optimizer steps, tokens, samples so far
    tracker: dict = field(default_factory=dict)  # BucketLossTracker.state_dict()
    rng: dict | None = None
    # The model the weights belong to (pipeline.learn.model_record) and the optimizer settings
    # they were trained with (pipeline.learn.resume_settings); None in older checkpoints.
    model_record: dict | None = None
    train_record: dict | None = None


def global_batch_definition(cfg: RunConfig, edges: list[int]) -> dict:
    """Every setting that decides which samples form each global step, as flat `section.field`
    keys. The world size is deliberately not one of them (contract 8)."""
    out: dict = {"buckets.edges": [int(e) for e in edges]}
    out.update({f"batching.{k}": v for k, v in cfg.batching.model_dump(mode="json").items()})
    plan = cfg.plan.model_dump(mode="json", exclude={"on_world_size_change"})
    out.update({f"plan.{k}": v for k, v in plan.items()})
    return out


def rng_state() -> dict:
    """This process's RNG states: torch CPU, the *current* CUDA device's (a rank owns one GPU;
    touching every visible device would initialise a context on each), python, numpy's legacy
    global. "cuda" is a one-element list, or empty without CUDA."""
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": [torch.cuda.get_rng_state()] if torch.cuda.is_available() else [],
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        # Older checkpoints hold every visible device's state: take the current device's.
        cuda = state["cuda"]
        i = torch.cuda.current_device() if len(cuda) > 1 else 0
        torch.cuda.set_rng_state(cuda[i] if i < len(cuda) else cuda[0])
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))


def _save_tensor_file(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _maybe_die_saving(steps_done: int) -> None:
    at, marker = os.environ.get(SAVE_FAIL_ENV), os.environ.get("BUCKETRAY_FAIL_MARKER")
    if at is None or marker is None or steps_done != int(at) or os.path.exists(marker + ".save"):
        return
    Path(marker + ".save").touch()
    os.kill(os.getpid(), signal.SIGKILL)


def save_run_config(directory: str | os.PathLike, cfg: RunConfig) -> None:
    """The run's config beside its weights, so a checkpoint can be evaluated on its own."""
    path = Path(directory) / RUN_CONFIG_FILE
    path.write_text(json.dumps(cfg.model_dump(mode="json"), indent=1))


def load_run_config(directory: str | os.PathLike) -> dict:
    """The config a checkpoint was written with, as a plain dict (not yet validated)."""
    path = Path(directory) / RUN_CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(
            f"{directory} has no {RUN_CONFIG_FILE} (written by runs since held-out evaluation "
            "existed): pass the run's config with --config"
        )
    return json.loads(path.read_text())


def save_checkpoint(directory: str | os.PathLike, state: TrainState, *, rank: int) -> None:
    """Write this rank's part of the checkpoint. Rank 0 writes state.json last, so a directory
    interrupted mid-write is recognisably incomplete, and refuses NaN/inf weights
    (NonFiniteLossError) before writing anything."""
    d = Path(directory)
    assert_finite_weights(state.model)  # never a checkpoint from a NaN/inf state, on any rank
    d.mkdir(parents=True, exist_ok=True)
    if state.rng is not None:
        _save_tensor_file(state.rng, d / f"rng_rank{rank}.pt")
    if rank != 0:
        return
    _save_tensor_file(state.model, d / "model.pt")
    _maybe_die_saving(state.position.steps_done)
    _save_tensor_file(state.optimizer, d / "optimizer.pt")
    _save_tensor_file(
        {"scheduler": state.scheduler, "counters": state.counters, "tracker": state.tracker},
        d / "trainer.pt",
    )
    meta = {
        "version": POSITION_VERSION,
        "position": state.position.to_dict(),
        "wandb_run_id": state.wandb_run_id,
        "model": state.model_record,
        "train": state.train_record,
    }
    tmp = d / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(meta, indent=1))
    os.replace(tmp, d / STATE_FILE)


@contextlib.contextmanager
def checkpoint_files(checkpoint: Any, names: Sequence[str] | None = None) -> Iterator[str]:
    """A local directory holding `checkpoint`'s files (a `ray.train.Checkpoint`, or anything with
    `path` and a pyarrow `filesystem`), for reading: its own path on a local filesystem, else a
    copy private to this reader of every file, or of `names` only, removed afterwards.

    Not Ray's `Checkpoint.as_directory`: every rank of a node downloads a remote checkpoint into
    one shared directory there, and a rank that arrives after the first download downloads again
    into it, rewriting the files another rank is reading (a torch.load of a half-written
    optimizer.pt, seen on resume from s3://)."""
    import pyarrow.fs as pafs

    if isinstance(checkpoint.filesystem, pafs.LocalFileSystem):
        yield checkpoint.path
        return
    local = tempfile.mkdtemp(prefix="bucketray-checkpoint-")
    root = checkpoint.path.rstrip("/")
    copies = [(root, local)] if names is None else [(f"{root}/{n}", f"{local}/{n}") for n in names]
    try:
        for source, destination in copies:
            pafs.copy_files(
                source,
                destination,
                source_filesystem=checkpoint.filesystem,
                chunk_size=64 * 1024 * 1024,
                use_threads=True,
            )
        yield local
    finally:
        shutil.rmtree(local, ignore_errors=True)


def load_checkpoint(
    directory: str | os.PathLike, *, rank: int = 0, map_location: str | torch.device = "cpu"
) -> TrainState:
    """Read a checkpoint written by save_checkpoint; `rng` is None when rank `rank` wrote none
    (e.g. the world grew)."""
    d = Path(directory)
    if not (d / STATE_FILE).is_file() and not any(d.glob("*.pt")):
        raise CheckpointError(
            f"{d} is not a checkpoint (no {STATE_FILE}, no *.pt files): give a checkpoint_* "
            "directory of a run (under checkpoint.storage_path/checkpoint.run_name)"
        )
    if not (d / STATE_FILE).is_file():
        raise CheckpointError(
            f"incomplete checkpoint: {d} has no {STATE_FILE} (interrupted while saving?); "
            "delete it to resume from the previous one"
        )
    meta = json.loads((d / STATE_FILE).read_text())
    if meta.get("version") != POSITION_VERSION:
        raise CheckpointError(
            f"{d / STATE_FILE}: checkpoint version {meta.get('version')!r}, this code reads "
            f"version {POSITION_VERSION}"
        )

    def load(name: str) -> Any:
        return torch.load(d / name, map_location=map_location, weights_only=True)

    trainer = load("trainer.pt")
    rng_file = d / f"rng_rank{rank}.pt"
    return TrainState(
        model=load("model.pt"),
        optimizer=load("optimizer.pt"),
        scheduler=trainer["scheduler"],
        position=DataPosition.from_dict(meta["position"]),
        wandb_run_id=meta["wandb_run_id"],
        counters=trainer["counters"],
        tracker=trainer["tracker"],
        rng=load(rng_file.name) if rng_file.is_file() else None,
        model_record=meta.get("model"),
        train_record=meta.get("train"),
    )


def check_resume(
    position: DataPosition,
    *,
    global_batch: dict,
    plan_hash: str,
    world_size: int,
    on_world_size_change: str,
    data_files: dict | None = None,
) -> None:
    """Refuse a resume that would silently change the sample order (contracts 7 and 8).

    `plan_hash` is this run's plan hash for `position.epoch`; `data_files` this run's per-shard
    digests, compared with the checkpoint's to name the shards that changed.
    """
    if position.global_batch != global_batch:
        changed = sorted(
            k
            for k in set(position.global_batch) | set(global_batch)
            if position.global_batch.get(k) != global_batch.get(k)
        )
        detail = ", ".join(
            f"{k}: {position.global_batch.get(k)!r} -> {global_batch.get(k)!r}" for k in changed
        )
        raise ResumeError(
            f"cannot resume: the checkpoint's global batches were defined differently ({detail}); "
            "restore those settings, or start a new run with another checkpoint.run_name"
        )
    if position.plan_hash != plan_hash:
        where = ""
        if data_files is not None and position.data_files:
            diff = describe_changes(position.data_files, data_files)
            where = f" ({diff})" if diff else " (yet every shard's ids and lengths match it)"
        raise ResumeError(
            f"cannot resume: epoch {position.epoch}'s plan hash is {plan_hash}, the checkpoint's is "
            f"{position.plan_hash}: the data (sample ids or lengths) changed since it was written"
            f"{where}; resume on the original data, or start a new run with another "
            "checkpoint.run_name"
        )
    if position.world_size != world_size and on_world_size_change == "refuse":
        raise ResumeError(
            f"cannot resume: the checkpoint was written by {position.world_size} workers, this run "
            f"has {world_size} and plan.on_world_size_change=refuse; set scaling.num_workers="
            f"{position.world_size}, or plan.on_world_size_change=keep_order (same global batches, "
            "split over the new number of workers)"
        )
