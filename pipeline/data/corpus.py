"""Write the seed-calibrated synthetic corpus as parquet shards, deterministically.

Lengths come from `synthetic.seed902k_lengths`, token ids from `synthetic.synthetic_tokens` called
once per shard (one vectorized expression), so writing the full 902,087-sample preset (~1.06B
tokens) is bound by generation and disk, not Python. Sample ids are the global row numbers
0..N-1, written as the `sample_id` column. A marker file records the parameters so a second call
with the same ones is a no-op and a call with different ones rewrites only files we wrote.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core.synthetic import PRESETS, seed902k_lengths, synthetic_tokens

__all__ = ["MARKER", "READS_NOTE", "ROW_GROUP_ROWS", "write_corpus", "corpus_is_current"]

# Starts with "_" so the shard listing (index.list_shards) skips it.
MARKER = "_bucketray_synthetic.json"
# Row groups are the unit of parallel reads and of skipping on resume; 16K rows of ~1.2K tokens
# is ~40 MB of int32 ids, well under Ray Data's 128 MB target block size. Smaller groups would
# not cut what an epoch reads: with the global within-bucket shuffle every chapter (and every
# lead-in range) has rows in nearly every group at 16K, 4K and 1K rows per group alike
# (docs/architecture.md, "Chapters"), so an epoch reads the corpus about once per chapter
# (once in all with the row cache, which decodes each group once).
ROW_GROUP_ROWS = 16_384
READS_NOTE = (
    "each chapter of an epoch (delivery.chapter_tokens) and each lead-in range after a start or "
    "resume has rows in nearly every row group, whatever their size: with delivery.row_cache (the "
    "default) the feeder decodes each row group once into its row cache and later chapters copy "
    "their rows from it; without it an epoch reads the corpus about once per chapter "
    "(docs/architecture.md, Chapters)"
)


def clear_output(out: Path, marker: Path, *, writer: str, choose: str) -> None:
    """Make `out` ready for a (re)write: refuse a directory `writer` did not write (no marker),
    then remove the marker first (an interrupted rewrite must not look complete) and the shards."""
    out.mkdir(parents=True, exist_ok=True)
    existing = [p for p in out.iterdir() if not p.name.startswith((".", "_"))]
    if existing and not marker.exists():
        raise FileExistsError(
            f"{out} already holds files not written by {writer} ({existing[0].name}, ...): "
            f"choose {choose}"
        )
    marker.unlink(missing_ok=True)
    for p in out.glob("shard-*.parquet"):
        p.unlink()


def token_table(sample_ids: np.ndarray, values: np.ndarray, offsets: np.ndarray) -> pa.Table:
    """The shard layout every bucketray writer produces: `sample_id` int64 and `input_ids` as a
    list of the token values (rows `offsets[i]:offsets[i+1]` of `values`; a shard past 2**31
    tokens gets large_list, whose offsets are int64)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    values = np.asarray(values)[offsets[0] : offsets[-1]]
    offsets = offsets - offsets[0]
    if offsets[-1] < 2**31:
        col = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))
    else:
        col = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))
    return pa.table(
        {"sample_id": pa.array(np.asarray(sample_ids, dtype=np.int64)), "input_ids": col}
    )


def _params(
    preset: str, num_samples: int, shards: int, vocab_size: int, seed: int, heldout: float = 0.0
) -> dict:
    extra = {"heldout": float(heldout)} if heldout else {}  # corpora without one stay current
    return {
        **extra,
        "version": 1,
        "preset": preset,
        "num_samples": int(num_samples),
        "shards": int(shards),
        "vocab_size": int(vocab_size),
        "seed": int(seed),
    }


def corpus_is_current(out_dir: str | Path, **params) -> bool:
    """True when `out_dir` holds a complete corpus written with exactly these parameters."""
    marker = Path(out_dir) / MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()) == _params(**params)
    except (OSError, json.JSONDecodeError):
        return False


def write_corpus(
    out_dir: str | Path,
    *,
    preset: str = "seed902k",
    num_samples: int | None = None,
    shards: int = 4,
    vocab_size: int = 512,
    seed: int = 0,
    heldout: float = 0.0,
    progress: bool = True,
) -> dict:
    """Write `num_samples` (default: the preset's size) samples into `shards` parquet files.

    With `heldout` > 0 the shards are split `train` and a held-out split `validation` of
    ceil(heldout x num_samples) more samples follows: the same generator and length
    distribution, sample ids after the training ones (so neither their ids nor their tokens are
    the training samples'). Returns a summary (samples, tokens, files, seconds). Idempotent for
    equal parameters.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}: choose one of {sorted(PRESETS)}")
    n = PRESETS[preset] if num_samples is None else int(num_samples)
    if n < 1 or shards < 1:
        raise ValueError(f"num_samples ({n}) and shards ({shards}) must be >= 1")
    shards = min(shards, n)
    out = Path(out_dir)
    params = _params(preset, n, shards, vocab_size, seed, heldout)
    if corpus_is_current(out, **{k: v for k, v in params.items() if k != "version"}):
        return {"samples": n, "files": shards, "skipped": True, "out_dir": str(out)}
    marker = out / MARKER
    clear_output(out, marker, writer="make_data", choose="an empty --out directory")

    t0 = time.perf_counter()
    lengths = seed902k_lengths(n, seed=seed)
    bounds = np.linspace(0, n, shards + 1).round().astype(np.int64)
    total_tokens = int(lengths.sum(dtype=np.int64))
    done_tokens = 0
    files = []
    for s in range(shards):
        lo, hi = int(bounds[s]), int(bounds[s + 1])
        ids = np.arange(lo, hi, dtype=np.int64)
        values, offsets = synthetic_tokens(lengths[lo:hi], ids, vocab_size=vocab_size, seed=seed)
        table = token_table(ids, values, offsets)
        path = out / f"{'train' if heldout else 'shard'}-{s:05d}.parquet"
        pq.write_table(table, path, row_group_size=ROW_GROUP_ROWS)
        files.append(path.name)
        done_tokens += int(offsets[-1])
        if progress:
            dt = time.perf_counter() - t0
            print(
                f"\rmake_data: shard {s + 1}/{shards}  {hi:,}/{n:,} samples  "
                f"{done_tokens / 1e6:,.0f}/{total_tokens / 1e6:,.0f} M tokens  "
                f"{done_tokens / max(dt, 1e-9) / 1e6:,.0f} M tok/s",
                end="" if s + 1 < shards else "\n",
                file=sys.stderr,
                flush=True,
            )
    if heldout:
        m = int(np.ceil(heldout * n))
        ids = np.arange(n, n + m, dtype=np.int64)
        held = seed902k_lengths(m, seed=seed + 1)
        values, offsets = synthetic_tokens(held, ids, vocab_size=vocab_size, seed=seed)
        pq.write_table(token_table(ids, values, offsets), out / "validation-00000.parquet")
        files.append("validation-00000.parquet")
    marker.write_text(json.dumps(params))
    return {
        "samples": n,
        "tokens": total_tokens,
        "files": len(files),
        "seconds": round(time.perf_counter() - t0, 2),
        "out_dir": str(out),
        "skipped": False,
        "row_group_rows": ROW_GROUP_ROWS,
        "reads": READS_NOTE,
    }
