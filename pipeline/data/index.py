"""Length index: one Ray Data pass over the shards gives (sample_id, length) and validates every row.

Each shard is scanned by a Ray Data task that reads its row groups with pyarrow and reduces every
row to a few numbers (length from `pyarrow.compute.list_value_length`, min/max token id, problem
flags), so no tokens reach the driver. The per-row facts depend only on the data, so they are cached
beside the data (or in data.cache_dir) under the shards' fingerprint (path, size, mtime) and a
second run reads no tokens; the config-dependent rules of contract 10 (vocabulary, top edge,
duplicates) are applied on the driver in milliseconds from that cache. Bad rows either stop the
run with file, sample id and reason, or are written to a quarantine parquet and counted.

Files are scanned whole, not through `ray.data.read_parquet`, because a derived sample id needs
the row's position in its file, and an unreadable file must be reported by name, not crash a read.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.core.config import RunConfig
from pipeline.core.corpus import corpus_is_current, write_corpus
from pipeline.core.textcorpus import TEXT_PRESETS, text_corpus_is_current, write_text_corpus

__all__ = [
    "DataError",
    "LengthIndex",
    "resolve_data_path",
    "build_length_index",
    "filesystem_for",
    "list_shards",
    "derived_sample_ids",
    "top_edge",
]

log = logging.getLogger("bucketray.data")

INDEX_VERSION = 1
# A derived sample id is (file ordinal << 40) | row: unique for < 2**23 files of < 2**40 rows.
ROW_BITS = 40

# Per-row problem flags found while scanning (data-only, so cacheable).
FLAG_NULL_ROW = 1
FLAG_NULL_TOKEN = 2
FLAG_MASK_LEN = 4
FLAG_LABELS_LEN = 8
FLAG_NULL_SID = 16

_SCAN_SCHEMA = pa.schema(
    [
        ("file_idx", pa.int32()),
        ("path", pa.string()),
        ("num_rows", pa.int64()),
        ("rg_rows", pa.list_(pa.int64())),
        ("has_sample_id", pa.bool_()),
        ("supervision", pa.string()),
        ("error", pa.string()),
        ("sample_id", pa.list_(pa.int64())),
        ("length", pa.list_(pa.int32())),
        ("min_id", pa.list_(pa.int64())),
        ("max_id", pa.list_(pa.int64())),
        ("flags", pa.list_(pa.uint8())),
        ("lab_min", pa.list_(pa.int64())),
        ("lab_max", pa.list_(pa.int64())),
    ]
)


class DataError(ValueError):
    """Bad input data, named by file, sample id and reason (contract 10)."""


@dataclass(frozen=True, eq=False)
class LengthIndex:
    """Valid samples of a dataset, sorted by sample id, with where each one lives."""

    sample_ids: np.ndarray  # int64, sorted ascending
    lengths: np.ndarray  # int32, aligned; clipped to the top edge under over_length=truncate
    files: list[str]  # every shard (filesystem paths), in file-ordinal order
    fingerprint: str
    num_quarantined: int  # quarantine records: bad rows plus unusable files
    file_idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # aligned
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # row in its file
    row_groups: tuple = ()  # per file: rows of each row group
    has_sample_id: tuple = ()  # per file: sample_id column present (else derived)
    supervision: str = ""  # "", "loss_mask" or "labels": the column delivered as labels
    truncate_to: int | None = None  # rows longer than this are truncated at delivery
    path: str = ""
    from_cache: bool = False
    quarantine_path: str | None = None

    @property
    def num_samples(self) -> int:
        return int(self.sample_ids.size)

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum(dtype=np.int64))


# --------------------------------------------------------------------------- paths and files


def filesystem_for(path: str) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, path inside it) for a local path or any URI pyarrow understands."""
    if "://" in path:
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), os.path.abspath(path)


def list_shards(fs: pafs.FileSystem, root: str) -> list[pafs.FileInfo]:
    """Every file under `root` whose path below it has no part starting with `_` or `.`, sorted.

    The `_`/`.` convention (Spark, Ray, Hive) keeps our own `_bucketray_index` and markers out;
    any other file is a shard, so a stray non-parquet file is reported instead of ignored.
    """
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.File:
        return [info]
    if info.type != pafs.FileType.Directory:
        raise DataError(f"data path {root} does not exist (data.path)")
    out = []
    for fi in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        if fi.type != pafs.FileType.File:
            continue
        rel = fi.path[len(root) :].lstrip("/")
        if any(part.startswith(("_", ".")) for part in rel.split("/")):
            continue
        out.append(fi)
    return sorted(out, key=lambda f: f.path)


def _fingerprint(shards: list[pafs.FileInfo]) -> str:
    h = hashlib.sha256(f"bucketray-index-v{INDEX_VERSION}".encode())
    for f in shards:
        h.update(f"{f.path}\0{f.size}\0{f.mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def derived_sample_ids(file_idx: int, rows: np.ndarray) -> np.ndarray:
    """Stable ids for a file without a sample_id column: (file ordinal << 40) | row."""
    return (np.int64(file_idx) << np.int64(ROW_BITS)) | np.asarray(rows, dtype=np.int64)


def top_edge(cfg: RunConfig) -> int:
    """Longest length the buckets accept: the explicit top edge, else data.max_length."""
    return int(cfg.buckets.edges[-1]) if cfg.buckets.edges is not None else int(cfg.data.max_length)


def resolve_data_path(cfg: RunConfig) -> str:
    """data.path, or the synthetic corpus at data.synthetic.out_dir, generated on first use."""
    if cfg.data.path is not None:
        return cfg.data.path
    syn = cfg.data.synthetic
    out = os.path.abspath(syn.out_dir)
    if syn.preset in TEXT_PRESETS:  # real text: the interpreter's stdlib source, built once
        if not text_corpus_is_current(out, preset=syn.preset, shards=syn.shards):
            print(
                f"bucketray: writing the {syn.preset} text corpus to {out} (first use)", flush=True
            )
            write_text_corpus(out, preset=syn.preset, shards=syn.shards)
        return out
    params = dict(
        preset=syn.preset,
        num_samples=syn.num_samples,
        shards=syn.shards,
        vocab_size=cfg.model.vocab_size,
        seed=syn.seed,
    )
    if not corpus_is_current(out, **params):
        print(f"bucketray: writing the synthetic corpus to {out} (first use)", flush=True)
        write_corpus(out, progress=True, **params)
    return out


# --------------------------------------------------------------------------- the scan (Ray tasks)


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


def _list_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """(absolute offsets int64, child values, row validity, child null mask or None)."""
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


def _is_int_list(t: pa.DataType, allow_bool: bool = False) -> bool:
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return False
    v = t.value_type
    return pa.types.is_integer(v) or (allow_bool and pa.types.is_boolean(v))


def _schema_error(schema: pa.Schema) -> str | None:
    names = schema.names
    if "input_ids" not in names:
        return f"missing column input_ids (columns: {names})"
    t = schema.field("input_ids").type
    if not _is_int_list(t):
        return f"wrong type for input_ids: {t}; expected list<int32> or list<int64>"
    if "loss_mask" in names and not _is_int_list(schema.field("loss_mask").type, allow_bool=True):
        return f"wrong type for loss_mask: {schema.field('loss_mask').type}; expected list<int8> or list<bool>"
    if "labels" in names and not _is_int_list(schema.field("labels").type):
        return f"wrong type for labels: {schema.field('labels').type}; expected list<int>"
    if "sample_id" in names and not pa.types.is_integer(schema.field("sample_id").type):
        return f"wrong type for sample_id: {schema.field('sample_id').type}; expected int64"
    return None


def _one(col: pa.ChunkedArray) -> pa.Array:
    return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)


def _scan_row_group(t: pa.Table, file_idx: int, row0: int) -> dict[str, np.ndarray]:
    n = t.num_rows
    ids = _one(t["input_ids"])
    offs, vals, valid, child_nulls = _list_parts(ids)
    starts, ends = offs[:-1], offs[1:]
    lengths = pc.fill_null(pc.list_value_length(ids), 0).to_numpy().astype(np.int32)
    flags = np.zeros(n, dtype=np.uint8)
    flags[~valid] |= FLAG_NULL_ROW
    if child_nulls is not None:
        flags[_segment_reduce(np.maximum, child_nulls.astype(np.int64), starts, ends, 0) > 0] |= (
            FLAG_NULL_TOKEN
        )
    info = np.iinfo(np.int64)
    mins = _segment_reduce(np.minimum, vals, starts, ends, 0)
    maxs = _segment_reduce(np.maximum, vals, starts, ends, 0)
    for name, flag in (("loss_mask", FLAG_MASK_LEN), ("labels", FLAG_LABELS_LEN)):
        if name in t.column_names:
            col = _one(t[name])
            other = pc.fill_null(pc.list_value_length(col), -1).to_numpy()
            flags[(other != lengths) | ~valid] |= flag
    lab_min = lab_max = np.zeros(0, dtype=np.int64)
    if "labels" in t.column_names:
        loffs, lvals, _, lnulls = _list_parts(_one(t["labels"]))
        # -100 (IGNORE_INDEX) is allowed anywhere; map it to 0 so the range check ignores it.
        lvals = np.where(lvals == -100, 0, lvals)
        lab_min = _segment_reduce(np.minimum, lvals, loffs[:-1], loffs[1:], 0)
        lab_max = _segment_reduce(np.maximum, lvals, loffs[:-1], loffs[1:], 0)
        if lnulls is not None:
            bad = _segment_reduce(np.maximum, lnulls.astype(np.int64), loffs[:-1], loffs[1:], 0) > 0
            lab_min[bad] = info.min
    if "sample_id" in t.column_names:
        sid_col = _one(t["sample_id"])
        if sid_col.null_count:
            flags[sid_col.is_null().to_numpy(zero_copy_only=False)] |= FLAG_NULL_SID
            sid_col = sid_col.fill_null(-1)
        sids = sid_col.to_numpy().astype(np.int64)
    else:
        sids = derived_sample_ids(file_idx, np.arange(row0, row0 + n))
    return {
        "sample_id": sids,
        "length": lengths,
        "min_id": mins,
        "max_id": maxs,
        "flags": flags,
        "lab_min": lab_min,
        "lab_max": lab_max,
    }


def scan_file(path: str, file_idx: int, fs: pafs.FileSystem) -> dict:
    """Per-row facts of one shard; file-level problems come back in `error`, never raised."""
    row = {
        "file_idx": file_idx,
        "path": path,
        "num_rows": -1,
        "rg_rows": [],
        "has_sample_id": False,
        "supervision": "",
        "error": None,
    }
    empty = {
        k: np.zeros(0, dtype=_SCAN_SCHEMA.field(k).type.value_type.to_pandas_dtype())
        for k in ("sample_id", "length", "min_id", "max_id", "flags", "lab_min", "lab_max")
    }
    try:
        pf = pq.ParquetFile(fs.open_input_file(path))
    except Exception as e:  # any reader failure means "not usable", reported by name
        return {**row, **empty, "error": f"not a readable parquet file ({type(e).__name__}: {e})"}
    md = pf.metadata
    row["num_rows"] = md.num_rows
    row["rg_rows"] = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
    schema = pf.schema_arrow
    err = _schema_error(schema)
    if err is not None:
        return {**row, **empty, "error": err}
    row["has_sample_id"] = "sample_id" in schema.names
    row["supervision"] = (
        "labels"
        if "labels" in schema.names
        else ("loss_mask" if "loss_mask" in schema.names else "")
    )
    cols = [c for c in ("input_ids", "sample_id", "loss_mask", "labels") if c in schema.names]
    parts = []
    row0 = 0
    try:
        for g in range(md.num_row_groups):
            t = pf.read_row_group(g, columns=cols)
            parts.append(_scan_row_group(t, file_idx, row0))
            row0 += t.num_rows
    except Exception as e:
        return {
            **row,
            **empty,
            "error": f"cannot read row group {len(parts)} ({type(e).__name__}: {e})",
        }
    out = {k: (np.concatenate([p[k] for p in parts]) if parts else empty[k]) for k in empty}
    return {**row, **out}


def _scan_batch(batch: pa.Table, fs: pafs.FileSystem) -> pa.Table:
    paths, idx = batch["path"].to_pylist(), batch["file_idx"].to_pylist()
    return _rows_to_table([scan_file(p, int(i), fs) for p, i in zip(paths, idx, strict=True)])


def _rows_to_table(rows: list[dict]) -> pa.Table:
    cols = {}
    for f in _SCAN_SCHEMA:
        vals = [r[f.name] for r in rows]
        if pa.types.is_list(f.type) and vals and isinstance(vals[0], np.ndarray):
            offsets = np.concatenate([[0], np.cumsum([v.size for v in vals])]).astype(np.int32)
            flat = np.concatenate(vals).astype(f.type.value_type.to_pandas_dtype(), copy=False)
            cols[f.name] = pa.ListArray.from_arrays(
                pa.array(offsets), pa.array(flat, f.type.value_type)
            )
        else:
            cols[f.name] = pa.array(vals, f.type)
    return pa.table(cols, schema=_SCAN_SCHEMA)


def _scan_all(fs: pafs.FileSystem, files: list[str]) -> pa.Table:
    import ray

    items = [{"file_idx": i, "path": p} for i, p in enumerate(files)]
    ds = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        _scan_batch, batch_size=1, batch_format="pyarrow", fn_kwargs={"fs": fs}
    )
    tables = ray.get(ds.to_arrow_refs())
    table = pa.concat_tables([t.cast(_SCAN_SCHEMA) for t in tables])
    order = np.argsort(table["file_idx"].to_numpy(), kind="stable")
    return table.take(pa.array(order))


# --------------------------------------------------------------------------- cache


def _cache_dir(cfg: RunConfig, path: str) -> str:
    if cfg.data.cache_dir is not None:
        return cfg.data.cache_dir
    return path.rstrip("/") + "/_bucketray_index"


def _load_cached(cache_dir: str, fp: str) -> pa.Table | None:
    try:
        fs, root = filesystem_for(cache_dir)
        return pq.read_table(f"{root}/index-{fp}.parquet", filesystem=fs)
    except (OSError, pa.ArrowInvalid):
        return None


def _save_cache(cache_dir: str, fp: str, table: pa.Table) -> None:
    try:
        fs, root = filesystem_for(cache_dir)
        fs.create_dir(root, recursive=True)
        tmp = f"{root}/.index-{fp}.parquet.tmp"
        pq.write_table(table, tmp, filesystem=fs)
        fs.move(tmp, f"{root}/index-{fp}.parquet")  # atomic on local disks: no half-written cache
    except OSError as e:
        log.warning(
            "could not cache the length index in %s (%s); the next run rescans", cache_dir, e
        )


# --------------------------------------------------------------------------- validation (driver)


def _flat(table: pa.Table, name: str) -> np.ndarray:
    return pc.list_flatten(table[name]).to_numpy()


def build_length_index(cfg: RunConfig, path: str | None = None) -> LengthIndex:
    """Scan (or load from cache) and validate every row; contract 10 decides what bad rows do."""
    path = path if path is not None else resolve_data_path(cfg)
    fs, root = filesystem_for(path)
    shards = list_shards(fs, root)
    if not shards:
        raise DataError(f"no shards under {path}: point data.path at a directory of parquet files")
    files = [f.path for f in shards]
    fp = _fingerprint(shards)
    cache_dir = _cache_dir(cfg, path)
    table = _load_cached(cache_dir, fp)
    from_cache = table is not None
    if table is None:
        table = _scan_all(fs, files)
        _save_cache(cache_dir, fp, table)
    return _validate(cfg, table, files, fp, path, cache_dir, from_cache)


_REASONS = {
    1: "input_ids is null",
    2: "null token id in input_ids",
    3: "empty input_ids",
    4: "length {length} exceeds the top bucket edge {top} (raise the top edge or set data.over_length=truncate)",
    5: "token id {min_id} < 0",
    6: "token id {max_id} >= model.vocab_size {vocab}",
    7: "loss_mask length != input_ids length",
    8: "labels length != input_ids length",
    9: "label outside [0, model.vocab_size {vocab}) and not -100",
    10: "sample_id is null",
    11: "duplicate sample_id (first seen in {first_file} row {first_row})",
}


def _validate(
    cfg: RunConfig,
    table: pa.Table,
    files: list[str],
    fp: str,
    path: str,
    cache_dir: str,
    from_cache: bool,
) -> LengthIndex:
    vocab = cfg.model.vocab_size
    top = top_edge(cfg)
    truncate = cfg.data.over_length == "truncate"
    errors = table["error"].to_pylist()
    nrows_file = table["num_rows"].to_numpy()
    ok_file = np.array([e is None for e in errors], dtype=bool)
    counts = pc.list_value_length(table["length"]).to_numpy()
    n = int(counts.sum())
    fidx = np.repeat(np.arange(len(files), dtype=np.int32), counts)
    rows = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    sid = _flat(table, "sample_id").astype(np.int64)
    length = _flat(table, "length").astype(np.int32)
    mins, maxs = _flat(table, "min_id"), _flat(table, "max_id")
    flags = _flat(table, "flags")
    has_labels = pc.list_value_length(table["lab_min"]).to_numpy() > 0
    lab_min = np.zeros(n, dtype=np.int64)
    lab_max = np.zeros(n, dtype=np.int64)
    lab_rows = np.repeat(has_labels, counts)
    lab_min[lab_rows] = _flat(table, "lab_min")
    lab_max[lab_rows] = _flat(table, "lab_max")

    # First reason wins: assign in reverse priority so earlier codes overwrite later ones.
    reason = np.zeros(n, dtype=np.int8)
    checks = [
        (10, (flags & FLAG_NULL_SID) > 0),
        (9, lab_rows & ((lab_min < 0) | (lab_max >= vocab))),
        (8, (flags & FLAG_LABELS_LEN) > 0),
        (7, (flags & FLAG_MASK_LEN) > 0),
        (6, maxs >= vocab),
        (5, mins < 0),
        (4, (length > top) & (not truncate)),
        (3, length == 0),
        (2, (flags & FLAG_NULL_TOKEN) > 0),
        (1, (flags & FLAG_NULL_ROW) > 0),
    ]
    for code, cond in checks:
        reason[cond] = code
    # Duplicates among otherwise good rows: the first (file order, row) is kept.
    good = np.flatnonzero(reason == 0)
    order = good[np.argsort(sid[good], kind="stable")]
    dup = np.zeros(n, dtype=bool)
    first_of = np.zeros(n, dtype=np.int64)
    if order.size > 1:
        same = sid[order[1:]] == sid[order[:-1]]
        if same.any():
            # The first occurrence of each run of equal ids.
            run_start = np.maximum.accumulate(
                np.where(np.concatenate([[True], ~same]), np.arange(order.size), 0)
            )
            later = np.flatnonzero(np.concatenate([[False], same]))
            dup[order[later]] = True
            first_of[order[later]] = order[run_start[later]]
    reason[dup] = 11

    bad = np.flatnonzero(reason > 0)
    bad_files = np.flatnonzero(~ok_file)
    records = []
    for i in bad_files.tolist():
        nr = int(nrows_file[i])
        records.append(
            (
                files[i],
                None,
                None,
                nr,
                f"{errors[i]} (whole file{'' if nr < 0 else f', {nr} rows'})",
            )
        )
    for i in bad.tolist():
        code = int(reason[i])
        fo = int(first_of[i])
        text = _REASONS[code].format(
            length=int(length[i]),
            top=top,
            min_id=int(mins[i]),
            max_id=int(maxs[i]),
            vocab=vocab,
            first_file=files[fidx[fo]] if code == 11 else "",
            first_row=int(rows[fo]),
        )
        sid_i = None if code == 10 else int(sid[i])
        records.append((files[fidx[i]], int(rows[i]), sid_i, 1, text))

    quarantine_path = None
    if records:
        if cfg.data.on_bad_rows.value == "error":
            raise DataError(_error_message(records, path))
        quarantine_path = cfg.data.quarantine_path or cache_dir.rstrip("/") + "/quarantine.parquet"
        _write_quarantine(quarantine_path, records)
        log.warning(
            "data: quarantined %d bad rows and %d unusable files to %s (data.on_bad_rows=quarantine)",
            bad.size,
            bad_files.size,
            quarantine_path,
        )

    keep = reason == 0
    order = np.argsort(sid[keep], kind="stable")
    kept_len = length[keep][order]
    if truncate:
        kept_len = np.minimum(kept_len, top).astype(np.int32)
    return LengthIndex(
        sample_ids=sid[keep][order],
        lengths=kept_len,
        files=list(files),
        fingerprint=fp,
        num_quarantined=len(records),
        file_idx=fidx[keep][order],
        rows=rows[keep][order],
        row_groups=tuple(tuple(r) for r in table["rg_rows"].to_pylist()),
        has_sample_id=tuple(table["has_sample_id"].to_pylist()),
        supervision=_dataset_supervision(table["supervision"].to_pylist(), ok_file),
        truncate_to=top if truncate else None,
        path=path,
        from_cache=from_cache,
        quarantine_path=quarantine_path,
    )


def _dataset_supervision(kinds: list[str], ok_file: np.ndarray) -> str:
    used = {k for k, ok in zip(kinds, ok_file, strict=True) if ok}
    return "labels" if "labels" in used else ("loss_mask" if "loss_mask" in used else "")


def _error_message(records: list[tuple], path: str, limit: int = 20) -> str:
    lines = [
        f"bad input in {path}: {len(records)} problem(s) (data.on_bad_rows=error). "
        "Fix the data, or set data.on_bad_rows=quarantine to write them with reasons to a "
        "quarantine parquet and train without them:"
    ]
    for file, row, sid, _, reason in records[:limit]:
        if row is None:
            lines.append(f"  {file}: {reason}")
        else:
            lines.append(f"  {file}: sample_id {sid} (row {row}): {reason}")
    if len(records) > limit:
        lines.append(f"  ... and {len(records) - limit} more")
    return "\n".join(lines)


def _write_quarantine(qpath: str, records: list[tuple]) -> None:
    file, row, sid, nrows, reason = zip(*records, strict=True)
    table = pa.table(
        {
            "file": pa.array(file, pa.string()),
            "row": pa.array(row, pa.int64()),
            "sample_id": pa.array(sid, pa.int64()),
            "num_rows": pa.array(nrows, pa.int64()),
            "reason": pa.array(reason, pa.string()),
        }
    )
    fs, p = filesystem_for(qpath)
    fs.create_dir(
        str(Path(p).parent) if "://" not in qpath else p.rsplit("/", 1)[0], recursive=True
    )
    pq.write_table(table, p, filesystem=fs)
