"""The row cache: each row group's checked rows, decoded once, kept on the feeder's node.

Every chapter's samples sit in nearly every row group (the shuffle is global within a bucket),
so without a cache each chapter decodes the whole corpus again to keep a chapter's share of it:
parquet bytes read per epoch grow with the number of chapters, and so does the CPU that
preparing the next chapter takes from training. The first full read of a row group (a regular
chapter's preparation, in the feeder) writes the rows it checked -- every indexed row of the
group: sample id, token ids in the delivered dtype, supervision, truncation applied -- to one
uncompressed Arrow IPC file; later preparations memory-map that file and copy out just their
rows. A range then costs its own bytes, not the corpus's, and the corpus is decoded once per
node, not once per chapter.

Files are named by a key over what decides their content: the file's path and indexed
row-group digests (a rewritten shard is re-indexed under new digests, so it gets new files),
the model's vocabulary (the range check), the supervision and truncation rules, the token
dtype and this module's format version. They are written to a temporary name and renamed, so
a reader never sees half a file; one that does not match the index (a different row, sample id
or length) is dropped and read again from parquet. The cache costs disk space equal to the
decoded corpus (4 bytes per token, plus supervision); a fill stops, with one warning, when the
disk would keep less than `MIN_FREE_BYTES` free, and the rows are read from parquet instead.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import uuid

import numpy as np
import pyarrow as pa

from pipeline.data.read import id_type_for, plan_read_units

__all__ = ["RowCache", "CachedRows", "row_cache_dir_for", "ROW_CACHE_VERSION", "MIN_FREE_BYTES"]

log = logging.getLogger("bucketray.data")

ROW_CACHE_VERSION = 1
# A fill leaves at least this much of the disk free (and 5% of it, whichever is larger).
MIN_FREE_BYTES = 2 * 1024**3


def row_cache_dir_for(configured: str | None, index_cache_dir: str) -> str:
    """data.row_cache_dir, else `rows` inside the index cache when that is a local directory,
    else `~/.cache/bucketray/rows` (the index cache is in object storage: files to memory-map
    must be on this node)."""
    if configured:
        return os.path.expanduser(configured)
    if index_cache_dir and "://" not in index_cache_dir:
        return os.path.join(index_cache_dir, "rows")
    return os.path.join(os.path.expanduser("~/.cache/bucketray"), "rows")


class CachedRows:
    """One row group's cached rows, memory-mapped: local row numbers, sample ids, and the flat
    token (and supervision) values with each row's offsets into them."""

    def __init__(self, table: pa.Table):
        def flat(name):  # a file holds one record batch: one chunk, no copy
            col = table[name]
            arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
            return arr.values.to_numpy(), arr.offsets.to_numpy()

        self.rows = table["row"].to_numpy()
        self.sample_ids = table["sample_id"].to_numpy()
        self.values, self.offsets = flat("input_ids")
        self.sup = flat("sup")[0] if "sup" in table.column_names else None

    def positions(self, local: np.ndarray) -> np.ndarray | None:
        """Where rows `local` (row numbers in the row group) sit; None if any is not cached."""
        pos = np.searchsorted(self.rows, local)
        if (pos >= self.rows.size).any() or not np.array_equal(self.rows[pos], local):
            return None
        return pos


class RowCache:
    """The row cache of one index (see the module docstring), in directory `root`."""

    def __init__(self, root: str, index, vocab_size: int, id_type):
        self.root = root
        self.index = index
        self._keys = [
            _file_key(index, f, vocab_size, np.dtype(id_type)) for f in range(len(index.files))
        ]
        self._all: dict | None = None  # every indexed row by (file, row group); see indexed()
        self._lock = threading.Lock()
        self._warned = False
        self.written_bytes = 0

    @classmethod
    def for_run(cls, cfg, index) -> RowCache | None:
        """The run's row cache (data.row_cache_dir, else beside the index), None when off."""
        if not cfg.data.row_cache:
            return None
        vocab = int(cfg.model.vocab_size)
        root = row_cache_dir_for(cfg.data.row_cache_dir, index.cache_dir)
        return cls(root, index, vocab, id_type_for(vocab))

    def describe(self) -> str:
        """Where it is and how much of this index it holds, in one line."""
        groups = [(f, g) for f, r in enumerate(self.index.row_groups) for g in range(len(r))]
        paths = [self.path(f, g) for f, g in groups]
        sizes = [os.path.getsize(p) for p in paths if os.path.exists(p)]
        if not groups:
            return f"row cache {self.root}: nothing to cache"
        line = (
            f"row cache {self.root}: {len(sizes)} of {len(groups)} row groups "
            f"({sum(sizes) / 1e9:.2f} GB)"
        )
        if len(sizes) < len(groups):
            line += "; the rest are decoded once, by the first chapter that needs them"
        return line

    def path(self, f: int, g: int) -> str:
        return os.path.join(self.root, f"{self._keys[f]}-g{g:05d}.arrow")

    def load(self, f: int, g: int) -> CachedRows | None:
        """Row group g of file f memory-mapped, or None when it is not cached (or unreadable:
        then it is removed, to be written again)."""
        p = self.path(f, g)
        try:
            with pa.memory_map(p) as src:
                table = pa.ipc.open_file(src).read_all()
            return CachedRows(table)
        except FileNotFoundError:
            return None
        except (OSError, pa.ArrowException, KeyError) as e:
            log.warning("data: dropping unreadable row cache file %s (%s)", p, e)
            self.drop(f, g)
            return None

    def drop(self, f: int, g: int) -> None:
        try:
            os.remove(self.path(f, g))
        except OSError:
            pass

    def indexed(self, f: int, g: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(local rows, sample ids, lengths) of every indexed row of row group g of file f."""
        with self._lock:
            if self._all is None:
                ix = self.index
                u = plan_read_units(ix, ix.sample_ids, np.zeros(ix.num_samples, np.int64))
                at = {
                    (int(a), int(b)): j
                    for j, (a, b) in enumerate(zip(u["file_idx"], u["row_group"], strict=True))
                }
                self._all = {"units": u, "at": at}
        u, j = self._all["units"], self._all["at"].get((f, g))
        if j is None:
            z = np.zeros(0, np.int64)
            return z, z, z
        lo, hi = u["ptr"][j], u["ptr"][j + 1]
        return u["local_rows"][lo:hi], u["sample_ids"][lo:hi], u["lengths"][lo:hi]

    def has_room(self, nbytes: int) -> bool:
        """Whether writing `nbytes` more leaves the disk its reserve (warns once when not)."""
        os.makedirs(self.root, exist_ok=True)
        du = shutil.disk_usage(self.root)
        reserve = max(MIN_FREE_BYTES, du.total // 20)
        if du.free - nbytes >= reserve:
            return True
        with self._lock:
            if not self._warned:
                self._warned = True
                log.warning(
                    "data: row cache %s stops filling: %.1f GB free, keeping %.1f GB free; rows "
                    "not cached are read from parquet for every chapter (set data.row_cache_dir "
                    "to a larger disk)",
                    self.root,
                    du.free / 1e9,
                    reserve / 1e9,
                )
        return False

    def store(self, f: int, g: int, rows: np.ndarray, table: pa.Table) -> bool:
        """Write the checked rows `table` (sample_id, input_ids[, sup]) of row group g of file
        f, `rows` their local row numbers, ascending; False when the disk has no room."""
        cols = {"row": pa.array(rows, pa.int64()), "sample_id": table["sample_id"]}
        cols["input_ids"] = table["input_ids"]
        if "sup" in table.column_names:
            cols["sup"] = table["sup"]
        out = pa.table(cols).combine_chunks()
        if not self.has_room(out.nbytes):
            return False
        p = self.path(f, g)
        tmp = f"{p}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, out.schema) as w:
                w.write_table(out, max_chunksize=max(1, out.num_rows))
            os.replace(tmp, p)
        except OSError as e:
            log.warning("data: could not write row cache file %s (%s)", p, e)
            try:
                os.remove(tmp)
            except OSError:
                pass
            return False
        with self._lock:
            self.written_bytes += out.nbytes
        return True


def _file_key(index, f: int, vocab_size: int, id_type: np.dtype) -> str:
    """What decides file f's cached rows (see the module docstring), hashed."""
    digests = index.rg_digests[f] if f < len(index.rg_digests) else ()
    # Without row-group digests, the dataset fingerprint (paths, sizes, footers) stands in.
    content = ",".join(digests) if digests else index.fingerprint
    h = hashlib.sha256(f"bucketray-rows-v{ROW_CACHE_VERSION}".encode())
    for part in (
        index.files[f],
        content,
        index.has_sample_id[f] if f < len(index.has_sample_id) else "",
        index.supervision,
        index.truncate_to,
        vocab_size,
        id_type.name,
    ):
        h.update(f"{part}\0".encode())
    return h.hexdigest()[:20]
