"""`jobs.tokenize --heldout`: a held-out split written by the tokenizer itself, as the demo's
corpus holds one out, so `eval.split: validation` works on a user's corpus unchanged.

Whole source files are held out (`heldout_files_of`: the fraction asked, the files whose paths
hash smallest, so the same files on every machine, and adding files moves at most a few), written as `validation-<ordinal>.parquet` beside the training
files' `train-<ordinal>.parquet`. A held-out document with exactly the tokens of a training
document (boilerplate, a file copied twice) would make every run refuse the split as a leak, so
it is dropped from the held-out shard and counted (`drop_heldout_duplicates`).

Also the job's console progress: whole lines, at most one per interval and one at the end, so a
log file reads well (`Progress`).
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.data.corpus import ROW_GROUP_ROWS
from pipeline.data.fs import filesystem_for
from pipeline.data.textcorpus import stable_id
from pipeline.data.tokenize_io import TokenizeError

__all__ = [
    "HELDOUT_SPLIT",
    "TRAIN_SPLIT",
    "Progress",
    "drop_heldout_duplicates",
    "heldout_files_of",
    "token_hash",
]

TRAIN_SPLIT, HELDOUT_SPLIT = "train", "validation"


def heldout_files_of(files: list[str], fraction: float) -> set[str]:
    """The input files (relative paths) held out: `fraction` of them, rounded, never none nor
    all, those whose paths hash smallest (the hash `textcorpus.heldout_files` compares to a
    threshold, which for a few files may hold out far more or fewer than asked)."""
    if len(files) < 2:
        raise TokenizeError(
            f"--heldout {fraction} holds out whole source files, and there is {len(files)} input "
            "file: split the corpus into several files, or tokenize a held-out folder with its "
            "own --out and set eval.path to it"
        )
    by_hash = sorted(set(files), key=lambda f: stable_id("heldout", f))
    n = min(max(1, round(fraction * len(by_hash))), len(by_hash) - 1)
    return set(by_hash[:n])


def token_hash(ids: np.ndarray) -> int:
    """A 63-bit hash of one document's token ids (int32), to find held-out duplicates."""
    data = np.ascontiguousarray(ids, dtype=np.int32).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def drop_heldout_duplicates(out: str, rows: list[dict], held: set[str]) -> int:
    """Remove from each held-out file's shard the documents whose tokens a training file's
    document has too (rows: the job's per-file results, with `ordinal`, `file`, `lengths` and
    `hashes`, updated in place); returns how many were dropped."""
    train = {h for r in rows if r["file"] not in held for h in r["hashes"]}
    fs, root = filesystem_for(out)
    dropped = 0
    for r in rows:
        if r["file"] not in held or len(r["hashes"]) == 0:
            continue
        dup = np.isin(np.asarray(r["hashes"], dtype=np.int64), np.fromiter(train, np.int64))
        if not dup.any():
            continue
        dropped += int(dup.sum())
        path = f"{root}/{HELDOUT_SPLIT}-{r['ordinal']:05d}.parquet"
        keep = ~dup
        r["lengths"] = [n for n, k in zip(r["lengths"], keep, strict=True) if k]
        r["hashes"] = [h for h, k in zip(r["hashes"], keep, strict=True) if k]
        if not keep.any():
            fs.delete_file(path)
            continue
        with fs.open_input_file(path) as f:
            table = pq.read_table(f)
        table = table.filter(pc.invert(pa.array(dup)))
        with fs.open_output_stream(path) as f:
            pq.write_table(table, f, row_group_size=ROW_GROUP_ROWS)
    return dropped


class Progress:
    """The job's progress on the console: one whole line per `interval_s` at most, and one
    after the last file (never carriage returns, which a log file shows as one long line)."""

    def __init__(
        self,
        total: int,
        stream=None,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.total, self.stream, self.interval_s, self.clock = total, stream, interval_s, clock
        self.files = self.samples = self.tokens = 0
        self.t0 = self.last = clock()

    def update(self, samples: int, tokens: int) -> None:
        self.files, self.samples, self.tokens = (
            self.files + 1,
            self.samples + samples,
            self.tokens + tokens,
        )
        now = self.clock()
        if self.files < self.total and now - self.last < self.interval_s:
            return
        self.last = now
        rate = self.tokens / max(now - self.t0, 1e-9) / 1e3
        print(
            f"tokenize: {self.files}/{self.total} files, {self.samples:,} samples, "
            f"{self.tokens:,} tokens, {rate:,.0f} Ktok/s",
            file=self.stream or sys.stderr,
            flush=True,
        )
