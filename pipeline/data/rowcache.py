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
or length) is dropped and read again from parquet.

Every file is verified when it is read back, as parquet is against the scan's row-group
digests: a fill reads the row group checked against its indexed digest, and the file records
that digest and a SHA-256 of what it holds (rows, sample ids, token values and offsets,
supervision). A file whose recorded row-group digest is not the index's, or whose content no
longer hashes to what it recorded (a flipped byte, a truncated copy), is dropped with a
warning naming it and filled again from parquet. Each process verifies a file once, and again
whenever its size, mtime or inode changes (a cached chapter then costs one hash of the file,
not one per chapter).

Where the cache goes: `delivery.row_cache_dir`, refused at start when it cannot be created; by
default `rows` beside the index cache, and when that directory cannot be written (a dataset on
a read-only or shared volume) `~/.cache/bucketray/rows` instead, with one warning; when
neither can be written, no cache (every range is read from parquet), with one warning. The cache costs disk space equal to the
decoded corpus (4 bytes per token, plus supervision); a fill stops, with one warning, when the
disk would keep less than `MIN_FREE_BYTES` free, and the rows are read from parquet instead.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
import uuid

import numpy as np
import pyarrow as pa

from pipeline.data.listcolumn import one_array, values_offsets
from pipeline.data.read import id_type_for, plan_read_units

__all__ = ["RowCache", "CachedRows", "row_cache_dir_for", "ROW_CACHE_VERSION", "MIN_FREE_BYTES"]
__all__ += ["check_row_cache_dir", "usable_row_cache_dir"]

log = logging.getLogger("bucketray.data")

# 2: each file records its row group's indexed digest and a digest of its content.
ROW_CACHE_VERSION = 2
# Schema metadata of a cache file (see the module docstring).
META_RG_DIGEST, META_CONTENT = b"bucketray.rg_digest", b"bucketray.content_sha256"
USER_CACHE = "~/.cache/bucketray/rows"
# A fill leaves at least this much of the disk free (and 5% of it, whichever is larger).
MIN_FREE_BYTES = 2 * 1024**3


def row_cache_dir_for(configured: str | None, index_cache_dir: str) -> str:
    """delivery.row_cache_dir, else `rows` inside the index cache when that is a local directory,
    else `~/.cache/bucketray/rows` (the index cache is in object storage: files to memory-map
    must be on this node)."""
    if configured:
        return os.path.expanduser(configured)
    if index_cache_dir and "://" not in index_cache_dir:
        return os.path.join(index_cache_dir, "rows")
    return os.path.expanduser(USER_CACHE)


def _writable(root: str) -> OSError | None:
    """None when `root` can be created and a file written in it, else the error."""
    try:
        os.makedirs(root, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".probe-"):
            pass
    except OSError as e:
        return e
    return None


def check_row_cache_dir(configured: str | None) -> None:
    """Refuse a `delivery.row_cache_dir` that cannot be created or written, naming the key."""
    from pipeline.core.config import ConfigError

    if not configured:
        return
    err = _writable(os.path.expanduser(configured))
    if err is not None:
        raise ConfigError(
            f"delivery.row_cache_dir={configured}: cannot create or write it ({err.strerror or err}); "
            "choose a writable local directory, leave it unset for the default, or set "
            "delivery.row_cache=false"
        )


def usable_row_cache_dir(configured: str | None, index_cache_dir: str, *, warn: bool) -> str | None:
    """The directory the row cache uses (see the module docstring), None when no default one
    can be written; `warn`: say so in one warning (the driver does, the feeder does not)."""
    root = row_cache_dir_for(configured, index_cache_dir)
    if configured:
        return root  # checked at start (check_row_cache_dir): a refusal, not a fallback
    err = _writable(root)
    if err is None:
        return root
    user = os.path.expanduser(USER_CACHE)
    if root != user and _writable(user) is None:
        if warn:
            log.warning(
                "data: row cache: cannot write %s (%s); using %s (set delivery.row_cache_dir to "
                "choose)", root, err.strerror or err, user,
            )  # fmt: skip
        return user
    if warn:
        log.warning(
            "data: row cache off: cannot write %s (%s) nor %s; every range is read from parquet "
            "(set delivery.row_cache_dir to a writable local directory)",
            root, err.strerror or err, user,
        )  # fmt: skip
    return None


class CachedRows:
    """One row group's cached rows, memory-mapped: local row numbers, sample ids, and the flat
    token (and supervision) values with each row's offsets into them."""

    def __init__(self, table: pa.Table):
        # a file holds one record batch: one chunk, memory-mapped, no copy
        self.rows = table["row"].to_numpy()
        self.sample_ids = table["sample_id"].to_numpy()
        self.values, self.offsets = values_offsets(table["input_ids"])
        self.sup = values_offsets(table["sup"])[0] if "sup" in table.column_names else None

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
        self._all: tuple | None = None  # every indexed row, and each unit by (file, row group)
        self._lock = threading.Lock()
        self._warned = False
        self._verified: dict[str, tuple] = {}  # path -> the stat it was verified under
        self.written_bytes = 0

    @classmethod
    def for_run(cls, cfg, index, *, warn: bool = False) -> RowCache | None:
        """The run's row cache (delivery.row_cache_dir, else beside the index, else in the user's
        cache), None when off or when no default directory can be written."""
        if not cfg.delivery_used.row_cache:
            return None
        vocab = int(cfg.model.vocab_size)
        root = usable_row_cache_dir(cfg.delivery.row_cache_dir, index.cache_dir, warn=warn)
        if root is None:
            return None
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
        """Row group g of file f memory-mapped and verified, or None when it is not cached (or
        unreadable, or fails verification: then it is removed, to be filled again)."""
        p = self.path(f, g)
        try:
            with pa.memory_map(p) as src:
                table = pa.ipc.open_file(src).read_all()
            why = self._unverified(p, f, g, table)
            rows = CachedRows(table)
        except FileNotFoundError:
            return None
        except (OSError, pa.ArrowException, KeyError) as e:
            log.warning("data: dropping unreadable row cache file %s (%s)", p, e)
            self.drop(f, g)
            return None
        if why:
            log.warning(
                "data: row cache file %s is corrupt (%s); dropped, its rows are read from "
                "parquet again", p, why,
            )  # fmt: skip
            self.drop(f, g)
            return None
        return rows

    def _unverified(self, p: str, f: int, g: int, table: pa.Table) -> str:
        """Why the file at `p` cannot be trusted; empty when it verifies (see the docstring)."""
        st = os.stat(p)
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            if self._verified.get(p) == stamp:
                return ""
        meta = table.schema.metadata or {}
        if meta.get(META_RG_DIGEST, b"").decode() != self._rg_digest(f, g):
            return "filled from other row-group content than the index's"
        if meta.get(META_CONTENT, b"").decode() != _content_digest(table):
            return "its token values or rows no longer match the digest written with them"
        with self._lock:
            self._verified[p] = stamp
        return ""

    def _rg_digest(self, f: int, g: int) -> str:
        """The index's digest of row group g of file f ("" where it has none)."""
        d = self.index.rg_digests[f] if f < len(self.index.rg_digests) else ()
        return d[g] if g < len(d) else ""

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
                    for j, (a, b) in enumerate(zip(u.file_idx, u.row_group, strict=True))
                }
                self._all = (u, at)
        u, at = self._all
        j = at.get((f, g))
        if j is None:
            z = np.zeros(0, np.int64)
            return z, z, z
        rows = u.unit(j)
        return rows.local_rows, rows.sample_ids, rows.lengths

    def has_room(self, nbytes: int) -> bool:
        """Whether writing `nbytes` more leaves the disk its reserve (warns once when not)."""
        try:
            os.makedirs(self.root, exist_ok=True)
            du = shutil.disk_usage(self.root)
        except OSError as e:  # became unwritable since the start: read from parquet instead
            self._warn_once("data: row cache %s stops filling (%s)", self.root, e)
            return False
        reserve = max(MIN_FREE_BYTES, du.total // 20)
        if du.free - nbytes >= reserve:
            return True
        self._warn_once(
            "data: row cache %s stops filling: %.1f GB free, keeping %.1f GB free; rows "
            "not cached are read from parquet for every chapter (set delivery.row_cache_dir "
            "to a larger disk)",
            self.root,
            du.free / 1e9,
            reserve / 1e9,
        )
        return False

    def _warn_once(self, msg: str, *args) -> None:
        with self._lock:
            if self._warned:
                return
            self._warned = True
        log.warning(msg, *args)

    def store(self, f: int, g: int, rows: np.ndarray, table: pa.Table) -> bool:
        """Write the checked rows `table` (sample_id, input_ids[, sup]) of row group g of file
        f, `rows` their local row numbers, ascending; False when the disk has no room."""
        cols = {"row": pa.array(rows, pa.int64()), "sample_id": table["sample_id"]}
        cols["input_ids"] = table["input_ids"]
        if "sup" in table.column_names:
            cols["sup"] = table["sup"]
        out = pa.table(cols).combine_chunks()
        out = out.replace_schema_metadata(
            {META_RG_DIGEST: self._rg_digest(f, g), META_CONTENT: _content_digest(out)}
        )
        if not self.has_room(out.nbytes):
            return False
        p = self.path(f, g)
        tmp = f"{p}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, out.schema) as w:
                w.write_table(out, max_chunksize=max(1, out.num_rows))
            os.replace(tmp, p)
            st = os.stat(p)
        except OSError as e:
            log.warning("data: could not write row cache file %s (%s)", p, e)
            try:
                os.remove(tmp)
            except OSError:
                pass
            return False
        with self._lock:
            self.written_bytes += out.nbytes
            # its digest was just computed from what was written: no need to hash it again
            self._verified[p] = (st.st_ino, st.st_size, st.st_mtime_ns)
        return True


def _content_digest(table: pa.Table) -> str:
    """SHA-256 of everything a cache file serves: each column's values in order (a list
    column as its row offsets from 0 and the values they span), over the arrays' own buffers."""
    h = hashlib.sha256()
    for name in table.column_names:
        arr = one_array(table[name])
        if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
            offs = arr.offsets.to_numpy()
            parts = (offs - offs[0], arr.values.to_numpy()[offs[0] : offs[-1]])
        else:
            parts = (arr.to_numpy(),)
        for v in parts:
            h.update(f"{name}:{v.dtype.str}:{v.size}\0".encode())
            h.update(np.ascontiguousarray(v))
    return h.hexdigest()


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
