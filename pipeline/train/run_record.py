"""What a run directory says about itself for comparisons (`jobs.compare_runs`): the held-out
set it was evaluated on (a digest written by the driver when it reads the set), and the run's
step history, evaluations (with the held-out loss by length range, where the run has ranges;
an eval.mode=async run's from its `evals/` records), bucket edges and config from its latest
checkpoint. Read offline, from the run directory alone (local or s3://)."""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass, field

import numpy as np
import pyarrow.fs as pafs

from pipeline.train.history import EvalHistory, StepHistory, read_evals, read_history

__all__ = [
    "HELDOUT_FILE",
    "RunRecord",
    "heldout_digest",
    "read_run",
    "read_run_heldout",
    "write_heldout_record",
]

HELDOUT_FILE = "heldout.json"  # in the run directory, beside the checkpoints


def heldout_digest(held_out) -> str:
    """SHA-256 (16 hex digits) of a held-out set's sample ids, lengths and tokens: two runs
    with the same digest were evaluated on the same samples, cut the same way."""
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(held_out.sample_ids, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(held_out.lengths, dtype=np.int64).tobytes())
    ids = held_out.table.column("input_ids").combine_chunks().flatten()
    h.update(np.ascontiguousarray(ids.to_numpy(zero_copy_only=False), dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


def write_heldout_record(fs: pafs.FileSystem, rdir: str, held_out) -> None:
    """Record the held-out set's digest and size in `<run dir>/heldout.json`. A record that
    cannot be written is a warning: comparisons then say they cannot check the set."""
    try:
        record = {
            "digest": heldout_digest(held_out),
            "samples": held_out.num_samples,
            "tokens": held_out.num_tokens,
            "path": str(held_out.path),
        }
        fs.create_dir(rdir, recursive=True)
        with fs.open_output_stream(f"{rdir}/{HELDOUT_FILE}") as f:
            f.write(json.dumps(record).encode())
    except Exception as e:  # noqa: BLE001 - the run stands without its record
        warnings.warn(f"could not record the held-out set's digest: {e}", stacklevel=2)


@dataclass
class RunRecord:
    """One run as a comparison reads it."""

    name: str
    history: StepHistory
    evals: EvalHistory
    config: dict = field(default_factory=dict)  # the run's recorded config ({} if none)
    heldout: dict = field(default_factory=dict)  # heldout.json ({} if none)
    edges: list[int] = field(default_factory=list)  # its training buckets' edges ([] if unknown)


def _json(fs: pafs.FileSystem, path: str) -> dict:
    try:
        with fs.open_input_stream(path) as f:
            return json.loads(f.read())
    except FileNotFoundError:
        return {}


def read_run_heldout(fs: pafs.FileSystem, rdir: str) -> dict:
    """The held-out record of the run directory `rdir` on `fs` ({} if none)."""
    return _json(fs, f"{rdir.rstrip('/')}/{HELDOUT_FILE}")


def read_run(run_dir: str) -> RunRecord:
    """The run at `run_dir`: its latest complete checkpoint's history, evaluations and config,
    and its held-out record. FileNotFoundError where it has no checkpoint with a history."""
    from pipeline.data.fs import filesystem_for
    from pipeline.learn.checkpoint import RUN_CONFIG_FILE
    from pipeline.train.resume_check import latest_position

    fs, rdir = filesystem_for(run_dir)
    rdir = rdir.rstrip("/")
    found = latest_position(fs, rdir)
    if found is None:
        raise FileNotFoundError(f"no complete checkpoint under {run_dir}")
    path, position = found
    history = read_history(fs, path)
    if len(history) == 0:
        raise FileNotFoundError(f"{path} has no step history to compare")
    edges = [int(e) for e in position.global_batch.get("buckets.edges", [])]
    evals = read_evals(fs, path)
    if len(evals) == 0:  # eval.mode=async records its evaluations beside the checkpoints
        from pipeline.train.evaluate_run import read_async_evals

        evals = read_async_evals(fs, rdir, max(len(edges) - 1, 1))
        evals.truncate(position.steps_done)  # those of the steps this history holds
    return RunRecord(
        name=rdir.rsplit("/", 1)[-1],
        history=history,
        evals=evals,
        config=_json(fs, f"{path}/{RUN_CONFIG_FILE}"),
        heldout=_json(fs, f"{rdir}/{HELDOUT_FILE}"),
        edges=edges,
    )
