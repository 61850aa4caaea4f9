"""The resume check, made on the driver before any worker starts.

The worker loop checks a checkpoint's data position against the current plan when it resumes
(`pipeline.learn.checkpoint.check_resume`). Made only there, a refused resume fails every
worker start-up Ray Train retries; made here first, it ends the run in seconds with one line
naming the checkpoint; so is one whose model config differs from the one the checkpoint
recorded (`pipeline.learn.model_record`), naming the fields. Also the one line on what
`data.over_length=truncate` cuts.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow.fs as pafs

from pipeline.core.config import RunConfig
from pipeline.core.manifest import file_digests
from pipeline.core.metrics import truncation_counts
from pipeline.core.runlength import run_length
from pipeline.learn.checkpoint import (
    STATE_FILE,
    DataPosition,
    ResumeError,
    check_resume,
    global_batch_definition,
)
from pipeline.learn.horizon import horizon_change, schedule_horizon
from pipeline.learn.model_record import check_same_model, model_record

__all__ = [
    "check_resume_on_driver",
    "data_file_digests",
    "latest_position",
    "truncation_metrics",
    "truncation_note",
]


def latest_position(fs: pafs.FileSystem, rdir: str) -> tuple[str, DataPosition] | None:
    """The complete checkpoint of `rdir` with the most global steps, and its data position."""
    best = None
    for info in fs.get_file_info(pafs.FileSelector(rdir, allow_not_found=True)):
        if info.type != pafs.FileType.Directory or not info.base_name.startswith("checkpoint_"):
            continue
        try:
            with fs.open_input_stream(f"{info.path}/{STATE_FILE}") as f:
                meta = json.loads(f.read())
        except FileNotFoundError:  # incomplete: Ray Train never reported it
            continue
        pos = DataPosition.from_dict(meta["position"])
        if best is None or pos.steps_done > best[1].steps_done:
            best = (info.path, pos)
    return best


def data_file_digests(index) -> dict[str, str]:
    """Per-shard digests of the index's samples, shard paths relative to the data path."""
    from pipeline.data.fs import filesystem_for

    root = filesystem_for(index.path)[1] if index.path else ""
    return file_digests(index.files, root, index.file_idx, index.sample_ids, index.lengths)


def check_resume_on_driver(
    cfg: RunConfig,
    fs: pafs.FileSystem,
    rdir: str,
    edges: list[int],
    epochs: list[dict],
    data_files: dict | None = None,
    *,
    steps_per_epoch: list[int] | None = None,
) -> str | None:
    """The worker loop's resume check, run before any worker starts: a checkpoint that cannot
    continue under this config or data is refused in seconds, not after every retry.
    `data_files` (`data_file_digests`) lets the refusal name the shards that changed;
    `steps_per_epoch` (the plan's) lets it check the LR schedule's horizon
    (`pipeline.learn.horizon`). Returns the line to print about that horizon, or None."""
    found = latest_position(fs, rdir)
    if found is None:
        return None
    path, p = found
    meta = _state(fs, path)
    check_same_model(meta.get("model"), model_record(cfg.model), where=f" {path}")
    if p.epoch >= len(epochs):
        return None
    elastic = cfg.scaling.min_workers is not None  # the world size is only known in the workers
    try:
        check_resume(
            p,
            global_batch=global_batch_definition(cfg, edges),
            plan_hash=epochs[p.epoch]["hash"],
            world_size=p.world_size if elastic else cfg.scaling.num_workers,
            on_world_size_change=cfg.plan.on_world_size_change,
            data_files=data_files,
        )
    except ResumeError as e:
        raise ResumeError(f"{e} (checkpoint {path})") from None
    if steps_per_epoch is None:
        return None
    # The optimizer steps done at the position (a group never spans an epoch boundary).
    ga = cfg.train.grad_accum
    done = sum(-(-s // ga) for s in steps_per_epoch[: p.epoch]) + -(-p.next_step // ga)
    total = run_length(steps_per_epoch, cfg.train).optimizer_steps
    change = horizon_change(meta.get("train"), cfg.train, total, done)
    return schedule_horizon(change, cfg.train, where=f" from {path}")[1]


def _state(fs: pafs.FileSystem, path: str) -> dict:
    """A checkpoint's state.json (its model record and optimizer settings: None in older
    checkpoints)."""
    with fs.open_input_stream(f"{path}/{STATE_FILE}") as f:
        return json.loads(f.read())


def truncation_metrics(index) -> dict[str, int]:
    """`epoch/truncated_samples` and `epoch/truncated_tokens` under data.over_length=truncate
    (the same every epoch: the cut depends on the data and the top edge only); {} otherwise."""
    raw = getattr(index, "untruncated_lengths", None)
    if index.truncate_to is None or raw is None:
        return {}
    c = truncation_counts(raw, index.truncate_to)
    return {
        "epoch/truncated_samples": c["truncated_samples"],
        "epoch/truncated_tokens": c["truncated_tokens"],
    }


def truncation_note(index) -> str | None:
    """One line on what data.over_length=truncate cuts, None when nothing is truncated."""
    top = index.truncate_to
    if top is None:
        return None
    raw = getattr(index, "untruncated_lengths", None)
    if raw is None:  # an index without them (built by hand): count what reaches the edge
        n = int(np.count_nonzero(index.lengths >= top))
        return f"data.over_length=truncate: {n:,} samples reach the top edge {top} (cut or exactly {top} long)"
    c = truncation_counts(raw, top)
    share = c["truncated_tokens"] / c["tokens"] if c["tokens"] else 0.0
    return (
        f"truncating {c['truncated_samples']:,} samples at the top edge {top}: "
        f"{c['truncated_tokens']:,} tokens cut ({share:.2%} of {c['tokens']:,})"
    )
