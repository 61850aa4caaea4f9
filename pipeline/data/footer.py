"""Footer fingerprints: what each row group's parquet footer says about the columns we read.

One small read per file, no tokens. The fingerprint of a row group covers its row count and,
for input_ids, sample_id, loss_mask and labels, each column chunk's compressed and uncompressed
size, encodings and min/max/null-count statistics. The index cache is keyed on them (a rewrite
that keeps size and mtime, as `cp -p` or `rsync -a` do, is rescanned) and `verify_unchanged`
compares them before each epoch, so a shard rewritten since indexing is named, not delivered.
A rewrite that keeps every size and every min/max is not seen here; even then every token lies
in the range the index validated.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.data._retry import is_transient, retrying
from pipeline.data.errors import DataError

if TYPE_CHECKING:
    from pipeline.data.index import LengthIndex

__all__ = ["read_footers", "row_group_fingerprints", "open_failed", "verify_unchanged"]

COLUMNS = ("input_ids", "sample_id", "loss_mask", "labels")
_THREADS = 16


def row_group_fingerprints(md: pq.FileMetaData) -> list[str]:
    """One short hex digest per row group of a file's footer."""
    out = []
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        h = hashlib.blake2b(f"{rg.num_rows}".encode(), digest_size=12)
        for c in range(rg.num_columns):
            col = rg.column(c)
            if col.path_in_schema.split(".", 1)[0] not in COLUMNS:
                continue
            st = col.statistics
            stats = (st.null_count, st.min, st.max) if st is not None and st.has_min_max else None
            h.update(
                repr(
                    (
                        col.path_in_schema,
                        col.compression,
                        col.encodings,
                        col.total_compressed_size,
                        col.total_uncompressed_size,
                        col.num_values,
                        stats,
                    )
                ).encode()
            )
        out.append(h.hexdigest())
    return out


def open_failed(path: str, e: BaseException, retries: int) -> DataError:
    """The error for a file that could not be opened or read: named, with what was tried."""
    if is_transient(e):
        return DataError(
            f"{path}: storage kept failing ({type(e).__name__}: {e}) after {retries} retries; "
            "the storage is throttling or unavailable: run again later"
        )
    return DataError(
        f"{path}: cannot open the file ({type(e).__name__}: {e}); not retried (not a transient "
        "storage error): check the path and its permissions"
    )


def _footer(fs: pafs.FileSystem, path: str) -> tuple[list[str] | None, int]:
    """(row-group fingerprints, or None for a file that is not parquet; retries taken)."""
    counter = [0]
    try:
        src = retrying(lambda: fs.open_input_file(path), counter)
    except OSError as e:
        raise open_failed(path, e, counter[0]) from e
    try:
        md = retrying(lambda: pq.ParquetFile(src).metadata, counter)
    except Exception as e:
        if is_transient(e):
            raise open_failed(path, e, counter[0]) from e
        return None, counter[0]  # not parquet: the scan reports it with its reason
    return row_group_fingerprints(md), counter[0]


def read_footers(fs: pafs.FileSystem, files: list[str]) -> tuple[list[list[str] | None], int]:
    """Every file's row-group fingerprints (None: not a parquet file), and the retries taken."""
    with ThreadPoolExecutor(min(_THREADS, max(1, len(files)))) as ex:
        got = list(ex.map(lambda p: _footer(fs, p), files))
    return [g[0] for g in got], sum(g[1] for g in got)


def verify_unchanged(index: LengthIndex, fs: pafs.FileSystem) -> None:
    """Raise DataError naming every shard (and row group) whose footer changed since indexing.

    Cheap: one footer read per indexed file. Files the index found unusable are skipped (none of
    their rows are planned).
    """
    idx = [i for i, fp in enumerate(index.rg_footers) if fp]
    problems = []
    files = [index.files[i] for i in idx]
    try:
        now, _ = read_footers(fs, files)
    except DataError as e:
        raise DataError(f"{e} (a shard changed since indexing?)") from e
    for i, cur in zip(idx, now, strict=True):
        was = index.rg_footers[i]
        path = index.files[i]
        if cur is None:
            problems.append(f"{path}: no longer a readable parquet file")
        elif len(cur) != len(was):
            problems.append(f"{path}: {len(cur)} row groups, the index has {len(was)}")
        else:
            changed = [g for g, (a, b) in enumerate(zip(cur, was, strict=True)) if a != b]
            if changed:
                groups = ", ".join(map(str, changed[:5])) + (", ..." if len(changed) > 5 else "")
                problems.append(f"{path}: row group {groups} changed (sizes or statistics)")
    if problems:
        raise DataError(
            f"{len(problems)} shard(s) changed since indexing: "
            + "; ".join(problems[:5])
            + ("; ..." if len(problems) > 5 else "")
            + ". Restore them, or delete the index cache to re-index (data.on_bad_rows decides)"
        )
