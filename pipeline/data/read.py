"""The read task: row groups holding planned samples -> rows with their sort keys, checked.

`plan_read_units` groups a range's planned samples by (file, row group) into a `ReadUnits` work
list; one Ray Data task per group (`read_units`), or the feeder itself (`read_unit`,
`pipeline.data.prepare`), reads it with pyarrow, keeps the planned rows, checks them against the
index and the model, and attaches each row's key. A read that fails transiently (throttling,
5xx, a reset connection) is retried with backoff (`pipeline.data.retry`) and counted; only a
difference in sample ids or lengths is reported as the file having changed. Files are opened here rather
than through `ray.data.read_parquet` because only a few rows of a row group may be planned
(resume, quarantine) and every row must be matched to its key.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.core.collate import IGNORE_INDEX, labels_from_mask
from pipeline.data.index import DataError, LengthIndex
from pipeline.data.listcolumn import flat_values
from pipeline.data.retry import RetryPolicy, StorageUnavailableError, with_retries
from pipeline.data.scan import ContentDigest, row_group_batches

__all__ = [
    "ReadSpec",
    "ReadUnits",
    "UnitRows",
    "background_priority",
    "id_type_for",
    "in_background",
    "plan_read_units",
    "read_row_group",
    "read_unit",
    "read_units",
]

# Nice value of threads that prepare ranges ahead of training (the lowest priority).
BACKGROUND_NICE = 19


def background_priority() -> None:
    """Run the calling thread at the lowest CPU priority (`BACKGROUND_NICE`).

    Preparing the next range is background work: on a node short of cores the streams that
    pad and hand over the current range's micro-batches (and the training itself) come first,
    and the preparation takes what they leave. Linux sets a nice value per thread; elsewhere
    (or where refused) this does nothing. A thread's nice value is only ever raised here, so
    calling it again is harmless.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
    except (AttributeError, OSError):
        pass


def in_background(fn, *args):
    """`fn(*args)` on a fresh thread at background priority; its result or its exception.

    For work in a process this code does not own (a Ray worker that runs other tasks later):
    the worker's own threads keep their priority, since a nice value once raised cannot be
    lowered again without privileges.
    """
    with ThreadPoolExecutor(1, initializer=background_priority) as pool:
        return pool.submit(fn, *args).result()


@dataclass(frozen=True)
class ReadSpec:
    """What every read task of an epoch shares: the files and how to deliver their rows."""

    files: tuple[str, ...]
    has_sample_id: tuple[bool, ...]  # per file: sample_id column present (else derived)
    supervision: str  # "", "loss_mask" or "labels": the dataset's, whatever this file holds
    truncate_to: int | None
    vocab_size: int
    retry: RetryPolicy = RetryPolicy()
    # Per file: the index's digest of each row group's input_ids; () where there is none.
    rg_digests: tuple[tuple[str, ...], ...] = ()

    @classmethod
    def of(cls, index: LengthIndex, vocab_size: int, retry: RetryPolicy) -> ReadSpec:
        return cls(
            tuple(index.files),
            tuple(index.has_sample_id),
            index.supervision,
            index.truncate_to,
            int(vocab_size),
            retry,
            tuple(tuple(d) for d in index.rg_digests),
        )

    @property
    def id_type(self):
        """Narrowest token dtype for the vocabulary (`id_type_for`)."""
        return id_type_for(self.vocab_size)

    @property
    def sup_type(self):
        """The delivered supervision's dtype: int8 for a loss mask, else the token dtype
        (labels are token ids); None without supervision."""
        if not self.supervision:
            return None
        return np.int8 if self.supervision == "loss_mask" else self.id_type


def id_type_for(vocab_size: int):
    """Narrowest token dtype for the vocabulary: int32 halves the bytes sorted and shipped."""
    return np.int32 if vocab_size <= np.iinfo(np.int32).max else np.int64


@dataclass(frozen=True)
class UnitRows:
    """One unit's planned rows: row group `row_group` of file `file_idx`, and per planned row
    (ascending in the group) its row number there, sort key, sample id and indexed length."""

    file_idx: int
    row_group: int
    local_rows: np.ndarray
    keys: np.ndarray
    sample_ids: np.ndarray
    lengths: np.ndarray


@dataclass(frozen=True, eq=False)
class ReadUnits:
    """The read work list of a range (`plan_read_units`): the units (row groups holding planned
    rows, as (file_idx, row_group) pairs) and, ordered by unit then row, the planned rows, with
    `ptr` delimiting each unit's slice (unit j's rows are [ptr[j], ptr[j + 1]))."""

    file_idx: np.ndarray  # [U] file of each unit
    row_group: np.ndarray  # [U] row group of each unit in its file
    local_rows: np.ndarray  # [N] each planned row's number in its row group
    keys: np.ndarray  # [N] its sort key
    sample_ids: np.ndarray  # [N]
    lengths: np.ndarray  # [N] its indexed length
    ptr: np.ndarray  # [U + 1]

    def __len__(self) -> int:
        return int(self.file_idx.size)

    def unit(self, j: int) -> UnitRows:
        """Unit `j`'s planned rows."""
        lo, hi = self.ptr[j], self.ptr[j + 1]
        return UnitRows(
            int(self.file_idx[j]),
            int(self.row_group[j]),
            self.local_rows[lo:hi],
            self.keys[lo:hi],
            self.sample_ids[lo:hi],
            self.lengths[lo:hi],
        )


def plan_read_units(index: LengthIndex, sample_ids: np.ndarray, keys: np.ndarray) -> ReadUnits:
    """Group planned samples (`keys`: their sort keys) by (file, row group): the read work list."""
    pos = np.searchsorted(index.sample_ids, sample_ids)
    if sample_ids.size and not np.array_equal(
        index.sample_ids[np.minimum(pos, index.num_samples - 1)], sample_ids
    ):
        raise AssertionError("plan holds sample ids that are not in the index")  # our invariant
    fidx = index.file_idx[pos].astype(np.int64)
    rows = index.rows[pos]
    # Global row-group table: one row per (file, row group) with its first row inside the file.
    rg_file = np.concatenate(
        [np.full(len(r), f, np.int64) for f, r in enumerate(index.row_groups)]
        or [np.zeros(0, np.int64)]
    )
    rg_start = np.concatenate(
        [np.cumsum([0, *r[:-1]]) if r else np.zeros(0, np.int64) for r in index.row_groups]
        or [np.zeros(0, np.int64)]
    ).astype(np.int64)
    rg_num = np.concatenate(
        [np.arange(len(r)) for r in index.row_groups] or [np.zeros(0, np.int64)]
    ).astype(np.int64)
    # Rows of the whole dataset numbered file after file, to find each row's row group at once.
    file_rows = np.array([sum(r) for r in index.row_groups], dtype=np.int64)
    file_base = np.concatenate([[0], np.cumsum(file_rows)[:-1]]).astype(np.int64)
    unit = np.searchsorted(file_base[rg_file] + rg_start, file_base[fidx] + rows, side="right") - 1
    order = np.lexsort((rows, unit))
    unit, rows, keys_o, sids = unit[order], rows[order], keys[order], sample_ids[order]
    lens = index.lengths[pos][order]
    present, first = np.unique(unit, return_index=True)
    ptr = np.concatenate([first, [unit.size]]).astype(np.int64)
    return ReadUnits(
        file_idx=rg_file[present],
        row_group=rg_num[present],
        local_rows=rows - rg_start[unit],
        keys=keys_o,
        sample_ids=sids,
        lengths=lens,
        ptr=ptr,
    )


def _read_rows(pf: pq.ParquetFile, g: int, cols: list[str], local: np.ndarray, digest):
    """Rows `local` (ascending) of row group `g`, each batch narrowed as it is decoded; every
    row goes through `digest` (a ContentDigest) when given."""
    pieces, row0 = [], 0
    for b in row_group_batches(pf, g, cols):
        n = b.num_rows
        if digest is not None:
            digest.update(b.column("input_ids"))
        lo, hi = np.searchsorted(local, [row0, row0 + n])
        if hi - lo == n:
            pieces.append(b)
        elif hi > lo:
            pieces.append(b.take(pa.array(local[lo:hi] - row0)))
        row0 += n
    schema = pieces[0].schema if pieces else pf.schema_arrow
    return pa.Table.from_batches(pieces, schema=schema).select(cols)


def _read_table(fs: pafs.FileSystem, spec: ReadSpec, f: int, g: int, local: np.ndarray):
    """(rows `local` of row group `g` of file `f`, whether the row group's content differs
    from the indexed digest, retries it took); transient failures are retried."""
    path = spec.files[f]
    known = spec.rg_digests[f] if f < len(spec.rg_digests) else ()
    if local.size > 1 and not (np.diff(local) > 0).all():
        raise AssertionError("planned rows of a row group must be ascending")  # our invariant

    def read() -> tuple[pa.Table, bool]:
        pf = pq.ParquetFile(fs.open_input_file(path))
        cols = ["input_ids"] + (["sample_id"] if spec.has_sample_id[f] else [])
        cols += [c for c in ("loss_mask", "labels") if c in pf.schema_arrow.names]
        value_type = pf.schema_arrow.field("input_ids").type.value_type
        digest = ContentDigest(value_type) if known else None
        t = _read_rows(pf, g, cols, local, digest)
        return t, digest is not None and digest.hexdigest() != known[g]

    try:
        (t, rewritten), retries = with_retries(
            read, what=f"{path}: row group {g}", policy=spec.retry
        )
        return t, rewritten, retries
    except StorageUnavailableError:
        raise  # names the file; an outage, not a data problem: a restart may get through
    except (OSError, pa.ArrowException) as e:  # pyarrow's own message does not name the file
        raise DataError(
            f"{path}: row group {g} became unreadable since indexing ({type(e).__name__}: {e}); "
            "restore the file, or delete the index cache to re-index it (data.on_bad_rows then "
            "decides)"
        ) from e


def _check_token_range(vals, path, g, local, sids, lens, vocab: int, what: str) -> None:
    """Every token in [0, vocab), checked on the file's own dtype before any narrowing cast."""
    if vals.size == 0:
        return
    ok_lo = vals.min() >= 0 if vals.dtype.kind == "i" else True
    if ok_lo and vals.max() < vocab:
        return
    bad = (vals >= vocab) if vals.dtype.kind != "i" else (vals < 0) | (vals >= vocab)
    if what == "labels":
        bad &= vals != IGNORE_INDEX
        if not bad.any():
            return
    k = int(np.flatnonzero(bad)[0])
    i = int(np.searchsorted(np.cumsum(lens), k, side="right"))
    raise DataError(
        f"{path}: row group {g} row {int(local[i])} (sample_id {int(sids[i])}) has {what} value "
        f"{vals[k]} outside [0, model.vocab_size={vocab}): fix the data or model.vocab_size "
        "(an index cache written before the file was rewritten is not re-validated: delete it)"
    )


def _supervision(t: pa.Table, vals: np.ndarray, kind: str) -> np.ndarray | None:
    """Flat supervision values of the dataset's `kind`, whichever column this file has."""
    names = t.column_names
    if kind == "labels":
        if "labels" in names:
            return flat_values(t["labels"])[0]
        if "loss_mask" in names:
            return labels_from_mask(vals, flat_values(t["loss_mask"])[0])
        return vals
    if kind == "loss_mask":
        if "loss_mask" in names:
            return flat_values(t["loss_mask"])[0].astype(np.int8)
        return np.ones(vals.size, np.int8)
    return None


def _truncate(vals, sup, lens, to: int):
    """Keep each row's first `to` tokens (data.over_length=truncate), vectorized."""
    starts = np.cumsum(lens) - lens
    keep = np.minimum(lens, to)
    idx = np.repeat(starts - (np.cumsum(keep) - keep), keep) + np.arange(int(keep.sum()))
    return vals[idx], (None if sup is None else sup[idx]), keep


def read_row_group(
    fs: pafs.FileSystem, spec: ReadSpec, f: int, g: int, local, keys, sids, lengths
) -> tuple[pa.Table, int]:
    """Planned rows `local` of row group `g` of file `f`, keyed; (table, read retries).

    Checks every row's sample id and length against the index and every token (and label)
    against the model's vocabulary before anything is narrowed or shipped.
    """
    path = spec.files[f]
    t, rewritten, retries = _read_table(fs, spec, f, g, local)
    if spec.has_sample_id[f]:
        got = t["sample_id"].to_numpy()
        if not np.array_equal(got, sids):
            i = int(np.flatnonzero(got != sids)[0])
            raise DataError(
                f"{path}: row group {g} row {int(local[i])} has sample_id {int(got[i])}, the index "
                f"says {int(sids[i])}: the file changed since indexing; delete the index cache"
            )
    vals, lens = flat_values(t["input_ids"])
    _check_token_range(vals, path, g, local, sids, lens, spec.vocab_size, "token")
    sup = _supervision(t, vals, spec.supervision)
    if spec.supervision == "labels" and "labels" in t.column_names:
        _check_token_range(sup, path, g, local, sids, lens, spec.vocab_size, "labels")
    if rewritten:  # after the checks above, which name a sample when one is out of range
        raise DataError(
            f"{path}: row group {g} changed since indexing (its tokens differ from the indexed "
            "content, e.g. rewritten with `cp -p`): restore the file, or delete the index cache "
            "to index it again"
        )
    if spec.truncate_to is not None and lens.size and lens.max() > spec.truncate_to:
        vals, sup, lens = _truncate(vals, sup, lens, spec.truncate_to)
    changed = np.flatnonzero(lens != lengths)
    if changed.size:
        i = int(changed[0])
        raise DataError(
            f"{path}: row group {g} row {int(local[i])} (sample_id {int(sids[i])}) has length "
            f"{int(lens[i])}, the index says {int(lengths[i])}: the file changed since indexing; "
            "delete the index cache"
        )
    offsets = pa.array(np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))
    cols = {
        "key": pa.array(keys, pa.int64()),
        "sample_id": pa.array(sids, pa.int64()),
        "input_ids": pa.LargeListArray.from_arrays(
            offsets, pa.array(vals.astype(spec.id_type, copy=False))
        ),
    }
    if sup is not None:
        cols["sup"] = pa.LargeListArray.from_arrays(
            offsets, pa.array(sup.astype(spec.sup_type, copy=False))
        )
    return pa.table(cols), retries


def read_units(batch: pa.Table, fs, units_ref, spec: ReadSpec, on_retries=None) -> pa.Table:
    """Ray Data `map_batches` function: read each unit of `batch` (see `plan_read_units`).

    `units_ref` is `[ObjectRef]` of the `ReadUnits` (refs in fn_kwargs are not dereferenced);
    `on_retries(n)`, when given, is called with the retries this batch needed, if any.
    """
    import ray

    u = ray.get(units_ref[0])
    return in_background(_read_batch, batch, fs, u, spec, on_retries)


def read_unit(fs, spec: ReadSpec, u: UnitRows) -> tuple[pa.Table, int]:
    """One unit's planned rows, keyed; (table, read retries)."""
    return read_row_group(
        fs, spec, u.file_idx, u.row_group, u.local_rows, u.keys, u.sample_ids, u.lengths
    )


def _read_batch(batch: pa.Table, fs, u: ReadUnits, spec: ReadSpec, on_retries) -> pa.Table:
    got = [read_unit(fs, spec, u.unit(j)) for j in batch["u"].to_pylist()]
    retries = sum(r for _, r in got)
    if retries and on_retries is not None:
        on_retries(retries)
    return pa.concat_tables([t for t, _ in got])
