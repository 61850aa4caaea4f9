"""The row cache's files, without Ray: what names them, what they hold, what they refuse."""

from __future__ import annotations

import logging
import os
from collections import namedtuple
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest

import pipeline.data.rowcache as rowcache
from pipeline.data.index import LengthIndex
from pipeline.data.rowcache import RowCache, row_cache_dir_for


def _index(**over) -> LengthIndex:
    # two files: file 0 with row groups of 3 and 2 rows, file 1 with one of 4 (row 1 quarantined)
    ix = LengthIndex(
        sample_ids=np.array([0, 1, 2, 3, 4, 5, 7, 8], np.int64),
        lengths=np.array([3, 1, 2, 4, 2, 5, 1, 2], np.int32),
        files=["/d/a.parquet", "/d/b.parquet"],
        fingerprint="fp",
        num_quarantined=1,
        file_idx=np.array([0, 0, 0, 0, 0, 1, 1, 1], np.int32),
        rows=np.array([0, 1, 2, 3, 4, 0, 2, 3], np.int64),
        row_groups=((3, 2), (4,)),
        has_sample_id=(True, True),
        rg_digests=(("d0", "d1"), ("d2",)),
    )
    return replace(ix, **over)


def _rows_table(lengths, first_token=0):
    offs = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    vals = np.arange(first_token, first_token + offs[-1], dtype=np.int32)
    return pa.table(
        {
            "sample_id": pa.array(np.arange(len(lengths)), pa.int64()),
            "input_ids": pa.LargeListArray.from_arrays(pa.array(offs), pa.array(vals)),
        }
    )


def test_row_cache_files_are_named_by_what_decides_their_content(tmp_path):
    def name(ix=None, vocab=512, dtype=np.int32, f=0):
        return os.path.basename(RowCache(str(tmp_path), ix or _index(), vocab, dtype).path(f, 1))

    base = name()
    assert base.endswith("-g00001.arrow") and name() == base  # stable
    assert name(f=1) != base  # another file
    assert name(_index(rg_digests=(("d0", "X"), ("d2",)))) != base  # re-indexed content
    assert name(_index(rg_digests=(("d0", "d1"), ("X",)))) == base  # only its own file counts
    assert name(vocab=1024) != base  # the range check
    assert name(dtype=np.int64) != base  # the delivered dtype
    assert name(_index(truncate_to=4)) != base
    assert name(_index(supervision="labels")) != base
    assert name(_index(files=["/e/a.parquet", "/d/b.parquet"])) != base
    # without row-group digests the dataset fingerprint stands in
    assert name(_index(rg_digests=(), fingerprint="f1")) != name(
        _index(rg_digests=(), fingerprint="f2")
    )


def test_stored_rows_load_memory_mapped_with_their_positions(tmp_path):
    cache = RowCache(str(tmp_path / "rows"), _index(), 512, np.int32)
    assert cache.load(0, 0) is None
    rows = np.array([0, 1, 2])
    assert cache.store(0, 0, rows, _rows_table([3, 1, 2], first_token=10))
    got = cache.load(0, 0)
    assert np.array_equal(got.rows, rows) and np.array_equal(got.sample_ids, [0, 1, 2])
    assert np.array_equal(got.offsets, [0, 3, 4, 6]) and got.values.dtype == np.int32
    assert np.array_equal(got.values, np.arange(10, 16)) and got.sup is None
    assert np.array_equal(got.positions(np.array([0, 2])), [0, 2])
    assert got.positions(np.array([1, 3])) is None  # a row it does not hold
    assert cache.written_bytes > 0
    assert [p for p in os.listdir(tmp_path / "rows") if p.endswith(".tmp")] == []


def test_indexed_rows_of_a_row_group_are_the_index_rows_it_holds(tmp_path):
    cache = RowCache(str(tmp_path), _index(), 512, np.int32)
    rows, sids, lens = cache.indexed(0, 1)
    assert rows.tolist() == [0, 1] and sids.tolist() == [3, 4] and lens.tolist() == [4, 2]
    rows, sids, lens = cache.indexed(1, 0)  # its row 1 is not indexed (quarantined)
    assert rows.tolist() == [0, 2, 3] and sids.tolist() == [5, 7, 8] and lens.tolist() == [5, 1, 2]


def test_an_unreadable_row_cache_file_is_dropped(tmp_path, caplog):
    cache = RowCache(str(tmp_path), _index(), 512, np.int32)
    with open(cache.path(0, 0), "wb") as f:
        f.write(b"not an arrow file")
    with caplog.at_level(logging.WARNING, "bucketray.data"):
        assert cache.load(0, 0) is None
    assert not os.path.exists(cache.path(0, 0)) and "unreadable row cache file" in caplog.text


def test_a_fill_that_would_leave_the_disk_short_is_skipped_with_one_warning(
    tmp_path, monkeypatch, caplog
):
    Usage = namedtuple("Usage", "total used free")
    free = rowcache.MIN_FREE_BYTES + 10
    monkeypatch.setattr(rowcache.shutil, "disk_usage", lambda _: Usage(10**9, 0, free))
    cache = RowCache(str(tmp_path), _index(), 512, np.int32)
    table = _rows_table([3, 1, 2])
    assert table.nbytes > 10
    with caplog.at_level(logging.WARNING, "bucketray.data"):
        assert not cache.store(0, 0, np.array([0, 1, 2]), table)
        assert not cache.store(0, 1, np.array([0, 1]), _rows_table([4, 2]))
    assert caplog.text.count("stops filling") == 1 and cache.load(0, 0) is None
    # room for it: written
    monkeypatch.setattr(rowcache.shutil, "disk_usage", lambda _: Usage(10**9, 0, 10 * free))
    assert cache.store(0, 0, np.array([0, 1, 2]), table) and cache.load(0, 0) is not None


@pytest.mark.parametrize(
    "configured,index_dir,want",
    [
        ("/fast/rows", "/d/_bucketray_index", "/fast/rows"),
        (None, "/d/_bucketray_index", "/d/_bucketray_index/rows"),
        (None, "s3://bucket/d/_bucketray_index", "~/.cache/bucketray/rows"),
    ],
)
def test_row_cache_dir_is_local(configured, index_dir, want):
    assert row_cache_dir_for(configured, index_dir) == os.path.expanduser(want)


def test_the_run_describes_its_row_cache_in_one_line(tmp_path):
    from pipeline.core.config import RunConfig

    cfg = RunConfig.model_validate(
        {
            "data": {"path": "/d"},
            "delivery": {"row_cache_dir": str(tmp_path)},
            "model": {"vocab_size": 512},
        }
    )
    cache = RowCache.for_run(cfg, _index())
    assert cache.root == str(tmp_path)
    assert cache.describe().startswith(f"row cache {tmp_path}: 0 of 3 row groups (0.00 GB)")
    cache.store(1, 0, np.array([0, 2, 3]), _rows_table([5, 1, 2]))
    assert ": 1 of 3 row groups" in cache.describe() and "the rest" in cache.describe()
    cache.store(0, 0, np.array([0, 1, 2]), _rows_table([3, 1, 2]))
    cache.store(0, 1, np.array([0, 1]), _rows_table([4, 2]))
    assert ": 3 of 3 row groups" in cache.describe() and "the rest" not in cache.describe()
    off = cfg.model_copy(update={"delivery": cfg.delivery.model_copy(update={"row_cache": False})})
    assert RowCache.for_run(off, _index()) is None


# --------------------------------------------------------------------------- verified on read


def _flip_a_token(path: str, old: int, new: int) -> None:
    """Overwrite one int32 token value in place, as a bad disk or a stray write would: the
    file still parses and every row, sample id and length still matches the index."""
    data = bytearray(open(path, "rb").read())
    at = data.find(np.int32(old).tobytes())
    assert at > 0
    data[at : at + 4] = np.int32(new).tobytes()
    open(path, "wb").write(bytes(data))


def test_a_row_cache_file_with_changed_token_values_is_dropped_naming_it(tmp_path, caplog):
    cache = RowCache(str(tmp_path), _index(), 512, np.int32)
    assert cache.store(0, 0, np.array([0, 1, 2]), _rows_table([3, 1, 2], first_token=300))
    assert cache.load(0, 0) is not None
    _flip_a_token(cache.path(0, 0), 303, 7)  # still inside the vocabulary
    fresh = RowCache(str(tmp_path), _index(), 512, np.int32)  # the next run's process
    with caplog.at_level(logging.WARNING, "bucketray.data"):
        assert fresh.load(0, 0) is None
    assert f"row cache file {cache.path(0, 0)} is corrupt" in caplog.text
    assert not os.path.exists(cache.path(0, 0))  # dropped: the next fill writes it again


def test_a_row_cache_file_filled_from_other_row_group_content_is_dropped(tmp_path, caplog):
    cache = RowCache(str(tmp_path), _index(), 512, np.int32)
    assert cache.store(0, 1, np.array([0, 1]), _rows_table([4, 2]))
    # same name (another index whose digests differ only where the key does not look), other
    # recorded row-group content: never served as this index's rows
    other = RowCache(str(tmp_path), _index(), 512, np.int32)
    other.index = _index(rg_digests=(("d0", "d1-rewritten"), ("d2",)))
    with caplog.at_level(logging.WARNING, "bucketray.data"):
        assert other.load(0, 1) is None
    assert "other row-group content" in caplog.text


def test_a_verified_file_is_hashed_once_per_process(tmp_path, monkeypatch):
    cache = RowCache(str(tmp_path), _index(), 512, np.int32)
    cache.store(0, 0, np.array([0, 1, 2]), _rows_table([3, 1, 2]))
    calls = []
    real = rowcache._content_digest
    monkeypatch.setattr(rowcache, "_content_digest", lambda t: calls.append(1) or real(t))
    assert cache.load(0, 0) is not None  # the writer computed its digest while writing it
    assert calls == []
    reader = RowCache(str(tmp_path), _index(), 512, np.int32)  # another process
    assert reader.load(0, 0) is not None and reader.load(0, 0) is not None
    assert len(calls) == 1


# --------------------------------------------------------------------------- where it can write


def _cfg(tmp_path, **data):
    from pipeline.core.config import RunConfig

    raw = {"data": {"path": str(tmp_path / "d"), **data}, "model": {"vocab_size": 512}}
    return RunConfig.model_validate(raw)


def test_an_unwritable_default_row_cache_falls_back_to_the_user_cache_with_one_warning(
    tmp_path, monkeypatch, caplog
):
    # the dataset's directory cannot take the cache (a file stands where `rows` would go, as a
    # read-only volume refuses it): the user's cache directory is used instead
    (tmp_path / "ro").write_text("not a directory")
    monkeypatch.setattr(rowcache, "USER_CACHE", str(tmp_path / "home-cache" / "rows"))
    ix = _index(cache_dir=str(tmp_path / "ro" / "_bucketray_index"))
    with caplog.at_level(logging.WARNING, "bucketray.data"):
        cache = RowCache.for_run(_cfg(tmp_path), ix, warn=True)
        feeder = RowCache.for_run(_cfg(tmp_path), ix)  # the feeder: same place, no warning
    assert cache.root == feeder.root == str(tmp_path / "home-cache" / "rows")
    assert caplog.text.count("WARNING") == 1 and "cannot write" in caplog.text
    assert cache.store(0, 0, np.array([0, 1, 2]), _rows_table([3, 1, 2]))
    # nowhere to write at all: no cache, every range read from parquet
    monkeypatch.setattr(rowcache, "USER_CACHE", str(tmp_path / "ro" / "rows"))
    assert RowCache.for_run(_cfg(tmp_path), ix, warn=True) is None
    assert "row cache off" in caplog.text


def test_an_uncreatable_row_cache_dir_is_refused_naming_the_key(tmp_path):
    from pipeline.core.config import ConfigError
    from pipeline.data.rowcache import check_row_cache_dir

    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"^delivery\.row_cache_dir=.*file/rows: cannot create"):
        check_row_cache_dir(str(tmp_path / "file" / "rows"))
    check_row_cache_dir(str(tmp_path / "ok"))  # creatable: fine
    check_row_cache_dir(None)
