"""The index cache: the scan table, stored beside the data (or in data.cache_dir) under the
dataset fingerprint, so a second run reads no tokens.

The fingerprint covers every shard's path, size and footer fingerprints (pipeline/data/footer.py),
not its mtime: a rewrite that keeps size and mtime (`cp -p`, `rsync -a`) but changes a column
chunk's size or statistics is rescanned, and touching a file is not a reason to rescan.
"""

from __future__ import annotations

import hashlib
import logging
import uuid

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.data.fs import filesystem_for

__all__ = ["INDEX_VERSION", "cache_dir_for", "dataset_fingerprint", "load_cached", "save_cache"]

log = logging.getLogger("bucketray.data")

# 5: a 64-bit hash of every row's tokens (the held-out overlap check); 4: row-group digests
# hash lengths, validity and values as three streams (a batched read computes them); 3: SHA-256
# (was blake2b). An older cache is simply rebuilt.
INDEX_VERSION = 5


def dataset_fingerprint(shards: list[pafs.FileInfo], footers: list[list[str] | None]) -> str:
    h = hashlib.sha256(f"bucketray-index-v{INDEX_VERSION}".encode())
    for f, fp in zip(shards, footers, strict=True):
        h.update(f"{f.path}\0{f.size}\0{','.join(fp) if fp is not None else '-'}\n".encode())
    return h.hexdigest()[:16]


def cache_dir_for(configured: str | None, path: str, single_file: bool) -> str:
    """data.cache_dir, else `_bucketray_index` beside the data: in the data directory, or for a
    single-file data.path in the file's directory."""
    if configured is not None:
        return configured
    base = path.rstrip("/")
    if single_file:
        base = base.rsplit("/", 1)[0] if "/" in base else "."
    return base + "/_bucketray_index"


def load_cached(cache_dir: str, fp: str) -> pa.Table | None:
    try:
        fs, root = filesystem_for(cache_dir)
        return pq.read_table(f"{root}/index-{fp}.parquet", filesystem=fs)
    except (OSError, pa.ArrowInvalid):
        return None


def save_cache(cache_dir: str, fp: str, table: pa.Table) -> None:
    tmp = None
    try:
        fs, root = filesystem_for(cache_dir)
        fs.create_dir(root, recursive=True)
        # A name of its own: two runs filling the same cache at once must not write into (or
        # move away) each other's temporary file; the last rename wins, with identical content.
        tmp = f"{root}/.index-{fp}.{uuid.uuid4().hex[:12]}.parquet.tmp"
        pq.write_table(table, tmp, filesystem=fs)
        fs.move(tmp, f"{root}/index-{fp}.parquet")  # atomic on local disks: no half-written cache
    except OSError as e:
        if tmp is not None:
            _remove_quietly(fs, tmp)
        log.warning(
            "could not cache the length index in %s (%s); the next run rescans", cache_dir, e
        )


def _remove_quietly(fs: pafs.FileSystem, path: str) -> None:
    try:
        fs.delete_file(path)
    except OSError:
        pass
