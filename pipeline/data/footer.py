"""Footer fingerprints: what each row group's parquet footer says about the columns we read.

One small read per file, no tokens. The fingerprint of a row group covers its row count and,
for input_ids, sample_id, loss_mask and labels, each column chunk's compressed and uncompressed
size, encodings and min/max/null-count statistics. The index cache is keyed on them (a rewrite
that keeps size and mtime, as `cp -p` or `rsync -a` do, is rescanned). A rewrite after indexing
is caught where the rows are read: each row group's input_ids digest is compared with the one the
scan stored (`read.read_row_group`), at no extra I/O.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.data.errors import DataError
from pipeline.data.retry import INDEX_POLICY, is_transient, retrying

__all__ = ["read_footers", "row_group_fingerprints", "open_failed"]

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
        src = retrying(lambda: fs.open_input_file(path), counter, INDEX_POLICY)
    except OSError as e:
        raise open_failed(path, e, counter[0]) from e
    try:
        md = retrying(lambda: pq.ParquetFile(src).metadata, counter, INDEX_POLICY)
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
