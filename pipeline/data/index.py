"""Length index: one Ray Data pass over the shards gives (sample_id, length) and validates every row.

The steps live in their own modules; this one runs them in order and holds the result:

    source.py    every cfg.data.* read; the synthetic corpus written on first use
    fs.py        filesystems and shard discovery (data.glob, data.split)
    footer.py    per-row-group footer fingerprints (the cache key)
    cache.py     the scan table cached under the dataset fingerprint (paths, sizes, footers)
    scan.py      the scan: one Ray Data task per shard, per-row facts, no tokens to the driver
    validate.py  contract 10: reasons, duplicates, quarantine

No tokens reach the driver, and a second run over unchanged shards reads only their footers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from pipeline.core.config import RunConfig
from pipeline.data.cache import cache_dir_for, dataset_fingerprint, load_cached, save_cache
from pipeline.data.errors import DataError
from pipeline.data.footer import read_footers
from pipeline.data.fs import filesystem_for, list_shards
from pipeline.data.scan import ROW_BITS, derived_sample_ids
from pipeline.data.scan import scan_all as _scan_all
from pipeline.data.source import data_options, resolve_data_path, top_edge
from pipeline.data.validate import Reason, check_duplicate_content, validate

__all__ = [
    "DataError",
    "LengthIndex",
    "ROW_BITS",
    "Reason",
    "resolve_data_path",
    "build_length_index",
    "filesystem_for",
    "list_shards",
    "derived_sample_ids",
    "top_edge",
]

log = logging.getLogger("bucketray.data")


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
    cache_dir: str = ""  # where the index cache is (the row cache defaults to a folder in it)
    from_cache: bool = False
    quarantine_path: str | None = None
    rg_footers: tuple = ()  # per file: footer fingerprint of each row group; () if unusable
    rg_digests: tuple = ()  # per file: digest of each row group's input_ids (scan.py)
    io_retries: int = 0  # transient storage errors retried while building this index
    # Aligned with `lengths`, before the cut at `truncate_to` (None when nothing is truncated):
    # what over_length=truncate removes is counted from these.
    untruncated_lengths: np.ndarray | None = None
    # Aligned with `lengths`: a 64-bit hash of each sample's tokens (scan.row_hashes), so a
    # held-out set is checked for samples the training data holds too.
    row_hashes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def num_samples(self) -> int:
        return int(self.sample_ids.size)

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum(dtype=np.int64))


def build_length_index(cfg: RunConfig, path: str | None = None) -> LengthIndex:
    """Discover, scan (or load from cache) and validate every row; contract 10 decides what bad
    rows do. Raises DataError for every user-fixable problem, with the fix."""
    opts = data_options(cfg, path if path is not None else resolve_data_path(cfg))
    fs, root = filesystem_for(opts.path)
    shards = list_shards(fs, root, glob=opts.glob, split=opts.split, exclude=opts.exclude_split)
    if not shards:
        raise DataError(
            f"no shards under {opts.path}: point data.path at a directory of parquet files"
            + (f" (data.glob={opts.glob!r} matched none)" if opts.glob else "")
        )
    single_file = len(shards) == 1 and shards[0].path.rstrip("/") == root.rstrip("/")
    files = [f.path for f in shards]
    footers, retries = read_footers(fs, files)
    fp = dataset_fingerprint(shards, footers)
    cache_dir = cache_dir_for(opts.cache_dir, opts.path, single_file)
    table = load_cached(cache_dir, fp)
    from_cache = table is not None
    if table is None:
        table = _scan_all(fs, files)
        fatal = [f for f in table["fatal"].to_pylist() if f is not None]
        if fatal:
            more = f" (and {len(fatal) - 1} more unreadable files)" if len(fatal) > 1 else ""
            raise DataError(fatal[0] + more)
        retries += int(table["retries"].to_numpy().sum())
        save_cache(cache_dir, fp, table)
    if retries:
        log.warning("data: %d transient storage errors retried while indexing", retries)
    check_duplicate_content(table, files)
    v = validate(table, files, opts, default_q=cache_dir.rstrip("/") + "/quarantine.parquet")
    order = np.argsort(v.sample_ids[v.keep], kind="stable")
    lengths = raw_lengths = v.lengths[v.keep][order]
    if opts.truncate:
        lengths = np.minimum(lengths, opts.top).astype(np.int32)
    return LengthIndex(
        sample_ids=v.sample_ids[v.keep][order],
        lengths=lengths,
        files=list(files),
        fingerprint=fp,
        num_quarantined=v.num_records,
        file_idx=v.file_idx[v.keep][order],
        rows=v.rows[v.keep][order],
        row_groups=tuple(tuple(r) for r in table["rg_rows"].to_pylist()),
        has_sample_id=tuple(table["has_sample_id"].to_pylist()),
        supervision=_dataset_supervision(table),
        truncate_to=opts.top if opts.truncate else None,
        path=opts.path,
        cache_dir=cache_dir,
        from_cache=from_cache,
        quarantine_path=v.quarantine_path,
        rg_footers=tuple(tuple(f) if f is not None else () for f in footers),
        rg_digests=tuple(tuple(d) for d in table["rg_digest"].to_pylist()),
        io_retries=retries,
        untruncated_lengths=raw_lengths if opts.truncate else None,
        row_hashes=v.row_hash[v.keep][order],
    )


def _dataset_supervision(table) -> str:
    ok = table["error"].is_null().to_pylist()
    used = {k for k, good in zip(table["supervision"].to_pylist(), ok, strict=True) if good}
    return "labels" if "labels" in used else ("loss_mask" if "loss_mask" in used else "")
