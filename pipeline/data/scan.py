"""The scan: one Ray Data task per shard reduces every row to a few numbers, no tokens leave it.

Per row: sample id, length, min/max token id and problem flags (and the labels' range); per row
group: a digest of its input_ids content (duplicate copies of a shard are found with it). These
depend only on the data, so they are cached. Files are scanned whole, not through
`ray.data.read_parquet`: a derived sample id needs the row's position in its file, and an
unreadable file must be reported by name, not crash a read. Transient storage errors are retried
with backoff and counted; other errors name the file.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.core.collate import IGNORE_INDEX
from pipeline.data.footer import open_failed
from pipeline.data.retry import INDEX_POLICY, is_transient, retrying

__all__ = [
    "ContentDigest",
    "Flag",
    "READ_BATCH_ROWS",
    "ROW_BITS",
    "SCAN_SCHEMA",
    "derived_sample_ids",
    "input_ids_digest",
    "row_group_batches",
    "scan_all",
    "scan_file",
]

# A derived sample id is (file ordinal << 40) | row: unique for < 2**23 files of < 2**40 rows.
ROW_BITS = 40
INT64_MAX = np.iinfo(np.int64).max


class Flag:
    """Per-row problem bits found while scanning (data-only, so cacheable)."""

    NULL_ROW = 1
    NULL_TOKEN = 2
    MASK_LEN = 4
    LABELS_LEN = 8
    NULL_SID = 16
    ID_OVER_INT64 = 32  # an unsigned token id >= 2**63: no int64 holds it
    SID_OVER_INT64 = 64  # an unsigned sample_id >= 2**63


SCAN_SCHEMA = pa.schema(
    [
        ("file_idx", pa.int32()),
        ("path", pa.string()),
        ("num_rows", pa.int64()),
        ("rg_rows", pa.list_(pa.int64())),
        ("rg_digest", pa.list_(pa.string())),
        ("has_sample_id", pa.bool_()),
        ("supervision", pa.string()),
        ("error", pa.string()),  # the file is unusable data (quarantinable)
        ("fatal", pa.string()),  # the file could not be read at all (the run stops)
        ("retries", pa.int32()),
        ("sample_id", pa.list_(pa.int64())),
        ("length", pa.list_(pa.int32())),
        ("min_id", pa.list_(pa.int64())),
        ("max_id", pa.list_(pa.int64())),
        ("flags", pa.list_(pa.uint8())),
        ("lab_min", pa.list_(pa.int64())),
        ("lab_max", pa.list_(pa.int64())),
        ("row_hash", pa.list_(pa.int64())),
    ]
)
_PER_ROW = ("sample_id", "length", "min_id", "max_id", "flags", "lab_min", "lab_max", "row_hash")
# Row hashes: a polynomial in the token position with an odd multiplier (the FNV-64 prime), so
# every power is a unit mod 2**64, then splitmix64's finaliser over the value and the length.
_HASH_BASE = np.uint64(0x100000001B3)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def derived_sample_ids(file_idx: int, rows: np.ndarray) -> np.ndarray:
    """Stable ids for a file without a sample_id column: (file ordinal << 40) | row."""
    return (np.int64(file_idx) << np.int64(ROW_BITS)) | np.asarray(rows, dtype=np.int64)


def _segment_reduce(
    ufunc, vals: np.ndarray, starts: np.ndarray, ends: np.ndarray, empty
) -> np.ndarray:
    """ufunc-reduce vals[starts[i]:ends[i]] for each i, vectorized; `empty` for empty segments."""
    out = np.full(starts.size, empty, dtype=np.int64)
    ne = ends > starts
    if ne.any():
        s, e = starts[ne], ends[ne]
        idx = np.empty(2 * s.size, dtype=np.int64)
        idx[0::2], idx[1::2] = s, e
        # Even positions reduce exactly [s, e); the trailing e is dropped so the last segment
        # runs to the end of the slice vals[:e_last].
        out[ne] = ufunc.reduceat(vals[: e[-1]], idx[:-1])[0::2]
    return out


def _var_list(arr: pa.Array) -> pa.Array:
    """A fixed_size_list as a large_list of the same values (lists and large_lists as they are)."""
    if pa.types.is_fixed_size_list(arr.type):
        return arr.cast(pa.large_list(arr.type.value_type))
    return arr


def _list_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """(absolute offsets int64, child values, row validity, child null mask or None)."""
    arr = _var_list(arr)
    offs = arr.offsets.to_numpy().astype(np.int64, copy=False)
    child = arr.values
    valid = (
        np.ones(len(arr), dtype=bool)
        if arr.null_count == 0
        else arr.is_valid().to_numpy(zero_copy_only=False)
    )
    child_nulls = None
    if child.null_count:
        child_nulls = child.is_null().to_numpy(zero_copy_only=False)
        child = child.fill_null(0)
    return offs, child.to_numpy(zero_copy_only=False), valid, child_nulls


def _as_int64(vals: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Values as int64 without wrapping: uint64 values >= 2**63 become INT64_MAX, flagged."""
    if vals.dtype == np.uint64:
        huge = vals > np.uint64(INT64_MAX)
        if huge.any():
            return np.where(huge, np.uint64(INT64_MAX), vals).astype(np.int64), huge
    return vals.astype(np.int64, copy=False), None


def row_hashes(vals: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """A 64-bit hash (as int64) of each row's token values vals[starts[i]:ends[i]]: rows with
    the same tokens have the same hash, and two different rows share one with chance ~2**-64.
    Vectorized; arithmetic wraps mod 2**64 by design."""
    lengths = (ends - starts).astype(np.int64)
    n = int(lengths.sum())
    if starts.size == 0:
        return np.zeros(0, dtype=np.int64)
    longest = int(lengths.max())
    powers = np.ones(max(longest, 1), dtype=np.uint64)
    if longest > 1:
        powers[1:] = np.cumprod(np.full(longest - 1, _HASH_BASE, dtype=np.uint64))
    idx = np.repeat(starts, lengths) + (
        np.arange(n) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    )
    pos = idx - np.repeat(starts, lengths)
    terms = (vals[idx].astype(np.int64).view(np.uint64) + np.uint64(1)) * powers[pos]
    compact_starts = np.cumsum(lengths) - lengths
    h = _segment_reduce(
        np.add, terms.view(np.int64), compact_starts, compact_starts + lengths, 0
    ).view(np.uint64)
    x = h ^ (lengths.view(np.uint64) * _MIX2)
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return (x ^ (x >> np.uint64(31))).view(np.int64)


def _any_in_rows(mask: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    return _segment_reduce(np.maximum, mask.astype(np.int64), starts, ends, 0) > 0


# Rows decoded at a time. A row group is read batch by batch, each batch narrowed (delivery) or
# reduced (scan) before the next is decoded: measured on 2 cores over 64 row groups of ~16K
# samples (~80 MB of tokens each), decoding whole row groups cost 11-13 CPU-s, batches of
# 256-1024 rows 6.5-7.7 (the decoder's buffers stay in cache, no fresh memory per row group).
READ_BATCH_ROWS = 512


def row_group_batches(pf: pq.ParquetFile, g: int, columns: list[str]):
    """Row group `g` of `pf` as record batches of `READ_BATCH_ROWS` rows, decoded on the calling
    thread: a Ray worker's Arrow CPU pool has OMP_NUM_THREADS threads (Ray sets it to the task's
    CPUs, often 1), so parallel readers would queue on one pool thread instead of decoding side
    by side."""
    return pf.iter_batches(
        batch_size=READ_BATCH_ROWS, row_groups=[g], columns=columns, use_threads=False
    )


class ContentDigest:
    """The digest of a row group's input_ids (LengthIndex.rg_digests), fed its rows in order,
    in batches of any size: the row lengths, the row validity and the values' bytes each go
    to a SHA-256 stream of their own, so a batched read gives the digest of the whole.

    SHA-256: with the CPU's SHA extensions about twice blake2b's speed here (1.7 vs 0.9 GB/s),
    and every read of a row group hashes all of its tokens once.
    """

    def __init__(self, value_type: pa.DataType):
        self._kind = str(value_type).encode()
        self._lengths, self._valid, self._values = (hashlib.sha256() for _ in range(3))

    def update(self, input_ids: pa.Array | pa.ChunkedArray) -> None:
        """Add the next rows (a list array, or its chunks in order)."""
        for arr in input_ids.chunks if isinstance(input_ids, pa.ChunkedArray) else [input_ids]:
            self.add(*_list_parts(arr)[:3])

    def add(self, offs: np.ndarray, vals: np.ndarray, valid: np.ndarray) -> None:
        """Add the next rows from their `_list_parts` (offsets, child values, validity)."""
        # the arrays' own buffers (C-contiguous: the same bytes as .tobytes(), no copy)
        self._lengths.update(np.ascontiguousarray(np.diff(offs)))
        self._valid.update(np.ascontiguousarray(valid))
        self._values.update(np.ascontiguousarray(vals[offs[0] : offs[-1]]))

    def hexdigest(self) -> str:
        h = hashlib.sha256(self._kind)
        for part in (self._lengths, self._valid, self._values):
            h.update(part.digest())
        return h.hexdigest()[:32]


def input_ids_digest(input_ids: pa.Array | pa.ChunkedArray) -> str:
    """The digest the scan stores per row group (LengthIndex.rg_digests), of a whole row
    group's input_ids as read back: delivery compares it to catch a rewrite with other tokens
    that the footer check cannot see."""
    d = ContentDigest(input_ids.type.value_type)
    d.update(input_ids)
    return d.hexdigest()


def _one(col: pa.ChunkedArray) -> pa.Array:
    return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)


def _scan_rows(t: pa.Table, file_idx: int, row0: int, digest: ContentDigest) -> dict:
    """Per-row facts of rows [row0, row0 + t.num_rows) of shard `file_idx`; their input_ids go
    on to their row group's `digest`."""
    n = t.num_rows
    ids = _one(t["input_ids"])
    offs, raw, valid, child_nulls = _list_parts(ids)
    digest.add(offs, raw, valid)
    starts, ends = offs[:-1], offs[1:]
    vals, huge = _as_int64(raw)
    lengths = pc.fill_null(pc.list_value_length(ids), 0).to_numpy().astype(np.int32)
    flags = np.zeros(n, dtype=np.uint8)
    flags[~valid] |= Flag.NULL_ROW
    if child_nulls is not None:
        flags[_any_in_rows(child_nulls, starts, ends)] |= Flag.NULL_TOKEN
    if huge is not None:
        flags[_any_in_rows(huge, starts, ends)] |= Flag.ID_OVER_INT64
    for name, flag in (("loss_mask", Flag.MASK_LEN), ("labels", Flag.LABELS_LEN)):
        if name in t.column_names:
            other = pc.fill_null(pc.list_value_length(_one(t[name])), -1).to_numpy()
            flags[(other != lengths) | ~valid] |= flag
    lab_min = lab_max = np.zeros(0, dtype=np.int64)
    if "labels" in t.column_names:
        loffs, lraw, _, lnulls = _list_parts(_one(t["labels"]))
        lvals, lhuge = _as_int64(lraw)
        # -100 (IGNORE_INDEX) is allowed anywhere; map it to 0 so the range check ignores it.
        lvals = np.where(lvals == IGNORE_INDEX, 0, lvals)
        lab_min = _segment_reduce(np.minimum, lvals, loffs[:-1], loffs[1:], 0)
        lab_max = _segment_reduce(np.maximum, lvals, loffs[:-1], loffs[1:], 0)
        if lnulls is not None:
            lab_min[_any_in_rows(lnulls, loffs[:-1], loffs[1:])] = np.iinfo(np.int64).min
    if "sample_id" in t.column_names:
        sid_col = _one(t["sample_id"])
        if sid_col.null_count:
            flags[sid_col.is_null().to_numpy(zero_copy_only=False)] |= Flag.NULL_SID
            sid_col = sid_col.fill_null(0)
        sids, sid_huge = _as_int64(sid_col.to_numpy())
        if sid_huge is not None:
            flags[sid_huge] |= Flag.SID_OVER_INT64
    else:
        sids = derived_sample_ids(file_idx, np.arange(row0, row0 + n))
    return {
        "sample_id": sids,
        "length": lengths,
        "min_id": _segment_reduce(np.minimum, vals, starts, ends, 0),
        "max_id": _segment_reduce(np.maximum, vals, starts, ends, 0),
        "flags": flags,
        "lab_min": lab_min,
        "lab_max": lab_max,
        "row_hash": row_hashes(vals, starts, ends),
    }


def _is_int_list(t: pa.DataType, allow_bool: bool = False) -> bool:
    if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)):
        return False
    v = t.value_type
    return pa.types.is_integer(v) or (allow_bool and pa.types.is_boolean(v))


def schema_error(schema: pa.Schema) -> str | None:
    """Why a shard's columns cannot be used, or None."""
    names = schema.names
    if "input_ids" not in names:
        return f"missing column input_ids (columns: {names})"
    t = schema.field("input_ids").type
    if not _is_int_list(t):
        return (
            f"wrong type for input_ids: {t}; expected a list of integers "
            "(list, large_list or fixed_size_list of int32/int64)"
        )
    if "loss_mask" in names and not _is_int_list(schema.field("loss_mask").type, allow_bool=True):
        return f"wrong type for loss_mask: {schema.field('loss_mask').type}; expected list<int8> or list<bool>"
    if "labels" in names and not _is_int_list(schema.field("labels").type):
        return f"wrong type for labels: {schema.field('labels').type}; expected list<int>"
    if "sample_id" in names and not pa.types.is_integer(schema.field("sample_id").type):
        return f"wrong type for sample_id: {schema.field('sample_id').type}; expected int64"
    return None


def _empty() -> dict:
    """A shard's facts before (or instead of) reading it: no row groups, no rows."""
    dtype = {k: SCAN_SCHEMA.field(k).type.value_type.to_pandas_dtype() for k in _PER_ROW}
    return {
        "num_rows": -1,
        "rg_rows": [],
        "rg_digest": [],
        "has_sample_id": False,
        "supervision": "",
        **{k: np.zeros(0, dt) for k, dt in dtype.items()},
    }


def _read_file(path: str, file_idx: int, fs: pafs.FileSystem, counter: list[int]) -> dict:
    """One attempt at a shard's facts; transient errors propagate (the caller retries)."""
    row = _empty()
    try:
        src = retrying(lambda: fs.open_input_file(path), counter, INDEX_POLICY)
    except OSError as e:
        return {**row, "fatal": str(open_failed(path, e, counter[0]))}
    try:
        pf = pq.ParquetFile(src)
    except Exception as e:  # any reader failure means "not usable", reported by name
        if is_transient(e):
            raise
        return {**row, "error": f"not a readable parquet file ({type(e).__name__}: {e})"}
    md, schema = pf.metadata, pf.schema_arrow
    row["num_rows"] = md.num_rows
    row["rg_rows"] = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
    err = schema_error(schema)
    if err is not None:
        return {**row, "error": err}
    row["has_sample_id"] = "sample_id" in schema.names
    row["supervision"] = next((c for c in ("labels", "loss_mask") if c in schema.names), "")
    cols = [c for c in ("input_ids", "sample_id", "loss_mask", "labels") if c in schema.names]
    parts, digests, row0 = [], [], 0
    try:
        for g in range(md.num_row_groups):
            digest = ContentDigest(schema.field("input_ids").type.value_type)
            for b in row_group_batches(pf, g, cols):
                t = pa.Table.from_batches([b])
                parts.append(_scan_rows(t, file_idx, row0, digest))
                row0 += t.num_rows
            digests.append(digest.hexdigest())
    except Exception as e:
        if is_transient(e):
            raise
        return {**row, "error": f"cannot read row group {len(digests)} ({type(e).__name__}: {e})"}
    if parts:
        row.update({k: np.concatenate([p[k] for p in parts]) for k in _PER_ROW})
    return {**row, "rg_digest": digests}


def scan_file(path: str, file_idx: int, fs: pafs.FileSystem) -> dict:
    """Per-row facts of one shard; file-level problems come back in `error` (unusable data) or
    `fatal` (unreadable storage), never raised."""
    counter = [0]
    base = {"file_idx": file_idx, "path": path, "error": None, "fatal": None}
    try:
        out = retrying(lambda: _read_file(path, file_idx, fs, counter), counter, INDEX_POLICY)
    except Exception as e:  # transient, tried INDEX_POLICY.attempts times
        out = {**_empty(), "fatal": str(open_failed(path, e, counter[0]))}
    return {**base, **out, "retries": counter[0]}


def _scan_batch(batch: pa.Table, fs: pafs.FileSystem, warnings_to: str | None = None) -> pa.Table:
    if warnings_to is not None:  # a task of a run: its warnings reach the driver's console
        from pipeline.data.run_warnings import forward_warnings

        forward_warnings(warnings_to, "index")
    paths, idx = batch["path"].to_pylist(), batch["file_idx"].to_pylist()
    return _rows_to_table([scan_file(p, int(i), fs) for p, i in zip(paths, idx, strict=True)])


def _rows_to_table(rows: list[dict]) -> pa.Table:
    cols = {}
    for f in SCAN_SCHEMA:
        vals = [r[f.name] for r in rows]
        if pa.types.is_list(f.type) and vals and isinstance(vals[0], np.ndarray):
            offsets = np.concatenate([[0], np.cumsum([v.size for v in vals])]).astype(np.int32)
            flat = np.concatenate(vals).astype(f.type.value_type.to_pandas_dtype(), copy=False)
            cols[f.name] = pa.ListArray.from_arrays(
                pa.array(offsets), pa.array(flat, f.type.value_type)
            )
        else:
            cols[f.name] = pa.array(vals, f.type)
    return pa.table(cols, schema=SCAN_SCHEMA)


def scan_all(fs: pafs.FileSystem, files: list[str]) -> pa.Table:
    """The scan table of every file, one Ray Data task per file, in file-ordinal order."""
    import ray

    from pipeline.data.connect import connect

    # Started by the project's rule, never by Ray Data's own ray.init(address=None), which joins
    # whatever cluster an address file left on the machine names (pipeline.data.connect).
    from pipeline.data.run_warnings import active_collector

    connect(include_dashboard=False)
    items = [{"file_idx": i, "path": p} for i, p in enumerate(files)]
    ds = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        _scan_batch,
        batch_size=1,
        batch_format="pyarrow",
        fn_kwargs={"fs": fs, "warnings_to": active_collector()},
    )
    tables = ray.get(ds.to_arrow_refs())
    table = pa.concat_tables([t.cast(SCAN_SCHEMA) for t in tables])
    order = np.argsort(table["file_idx"].to_numpy(), kind="stable")
    return table.take(pa.array(order))
