"""The resume check, made on the driver before any worker starts.

The worker loop checks a checkpoint's data position against the current plan when it resumes
(`pipeline.learn.checkpoint.check_resume`). Made only there, a refused resume fails every
worker start-up Ray Train retries; made here first, it ends the run in seconds with one line
naming the checkpoint. Also the one line on what `data.over_length=truncate` cuts.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow.fs as pafs

from pipeline.core.config import RunConfig
from pipeline.learn.checkpoint import (
    STATE_FILE,
    DataPosition,
    ResumeError,
    check_resume,
    global_batch_definition,
)
from pipeline.train.preflight import truncation_summary

__all__ = ["check_resume_on_driver", "latest_position", "truncation_note"]


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


def check_resume_on_driver(
    cfg: RunConfig, fs: pafs.FileSystem, rdir: str, edges: list[int], epochs: list[dict]
) -> None:
    """The worker loop's resume check, run before any worker starts: a checkpoint that cannot
    continue under this config or data is refused in seconds, not after every retry."""
    found = latest_position(fs, rdir)
    if found is None or found[1].epoch >= len(epochs):
        return
    path, p = found
    elastic = cfg.scaling.min_workers is not None  # the world size is only known in the workers
    try:
        check_resume(
            p,
            global_batch=global_batch_definition(cfg, edges),
            plan_hash=epochs[p.epoch]["hash"],
            world_size=p.world_size if elastic else cfg.scaling.num_workers,
            on_world_size_change=cfg.plan.on_world_size_change,
        )
    except ResumeError as e:
        raise ResumeError(f"{e} (checkpoint {path})") from None


def truncation_note(index) -> str | None:
    """One line on what data.over_length=truncate cuts, None when nothing is truncated."""
    top = index.truncate_to
    if top is None:
        return None
    raw = getattr(index, "untruncated_lengths", None)
    if raw is not None:
        n, share = truncation_summary(raw, top)
        return f"truncating {n:,} samples ({share:.2%} of tokens) to the top edge {top}"
    n = int(np.count_nonzero(index.lengths >= top))
    return f"data.over_length=truncate: {n:,} samples reach the top edge {top} (cut or exactly {top} long)"
