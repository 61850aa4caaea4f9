"""Messy real-world input: Hugging Face split layouts, backup copies, unsigned and fixed-size
columns, rewrites that keep size and mtime, single-file paths, flaky storage. Each case either
works as documented or stops with one DataError naming the file and the fix."""

from __future__ import annotations

import os
import shutil
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

import pipeline.data.index
from pipeline.data import (
    DataError,
    build_length_index,
    rank_batches,
    start_feeder,
    stop_feeder,
)
from pipeline.data.index import Reason
from pipeline.data.scan import input_ids_digest
from tests.flaky_fs import flaky_fs, opens
from tests.ray.test_bad_input import EDGES, ROWS, VOCAB, cfg_for, dataset, good_rows, write

pytestmark = pytest.mark.ray


def _deliver(cfg, index, d) -> np.ndarray:
    name = f"messy-{uuid.uuid4().hex[:6]}"
    start_feeder(cfg, index, EDGES, name=name, path=str(d), prefetch=False)
    try:
        return np.concatenate(
            [
                mb.sample_ids
                for mb in rank_batches(name, epoch=0, start_step=0, rank=0, world_size=1)
            ]
        )
    finally:
        stop_feeder(name)


def _no_sid(path, f, n=ROWS):
    """A shard without a sample_id column (ids derived from file ordinal and row)."""
    _, tokens = good_rows(f, n)
    pq.write_table(pa.table({"input_ids": pa.array(tokens, pa.list_(pa.int32()))}), path)


# --------------------------------------------------------------------------- discovery


def _hf_layout(root):
    (root / "data").mkdir(parents=True)
    for f, split in enumerate(("train", "test", "validation")):
        write(root / "data" / f"{split}-00000-of-00001.parquet", *good_rows(f))
    return root / "data"


def test_mixed_split_files_are_refused_naming_them(cluster, tmp_path):
    d = _hf_layout(tmp_path / "hf")
    with pytest.raises(DataError) as e:
        build_length_index(cfg_for(d))
    msg = str(e.value)
    assert "mixes the files of 3 splits" in msg and "data.split" in msg, msg
    for split in ("train", "test", "validation"):
        assert f"{split}-00000-of-00001.parquet" in msg, msg


def test_split_and_glob_select_one_split(cluster, tmp_path):
    d = _hf_layout(tmp_path / "hf")
    by_split = build_length_index(cfg_for(d, split="train"))
    assert [os.path.basename(f) for f in by_split.files] == ["train-00000-of-00001.parquet"]
    assert by_split.num_samples == ROWS
    by_glob = build_length_index(cfg_for(tmp_path / "hf", glob="data/test-*.parquet"))
    assert [os.path.basename(f) for f in by_glob.files] == ["test-00000-of-00001.parquet"]


def test_shards_only_in_subfolders_name_data_glob(cluster, tmp_path):
    _hf_layout(tmp_path / "hf")
    with pytest.raises(DataError, match=r"no shards directly in .*data\.glob"):
        build_length_index(cfg_for(tmp_path / "hf"))


def test_backup_copy_in_a_subfolder_is_not_trained(cluster, tmp_path):
    d = tmp_path / "data"
    (d / "old").mkdir(parents=True)
    _no_sid(d / "part-00000.parquet", 0)
    shutil.copy(d / "part-00000.parquet", d / "old" / "part-00000.parquet")
    cfg = cfg_for(d)
    index = build_length_index(cfg)
    assert index.files == [str(d / "part-00000.parquet")] and index.num_samples == ROWS
    assert np.array_equal(np.sort(_deliver(cfg, index, d)), index.sample_ids)


def test_identical_row_groups_without_sample_id_are_refused_naming_both(cluster, tmp_path):
    d = tmp_path / "data"
    (d / "old").mkdir(parents=True)
    _no_sid(d / "part-00000.parquet", 0)
    shutil.copy(d / "part-00000.parquet", d / "old" / "part-00000.parquet")
    with pytest.raises(DataError) as e:
        build_length_index(cfg_for(d, glob="**/*.parquet"))
    msg = str(e.value)
    assert "identical input_ids" in msg, msg
    assert str(d / "part-00000.parquet") in msg and str(d / "old" / "part-00000.parquet") in msg


# --------------------------------------------------------------------------- value ranges


def _uint64_tokens(d):
    tokens = [np.array([1, 2**63 + 5, 4], np.uint64)]
    write(d / "c.parquet", [2000], tokens, id_type=pa.uint64())


def _uint64_sample_id(d):
    pq.write_table(
        pa.table(
            {
                "sample_id": pa.array([2000, 2**63 + 7], pa.uint64()),
                "input_ids": pa.array([[1, 2], [3, 4]], pa.list_(pa.int32())),
            }
        ),
        d / "c.parquet",
    )


@pytest.mark.parametrize(
    "mutate,expected",
    [
        (_uint64_tokens, "sample_id 2000 (row group 0, row 0): token id >= 2**63"),
        (_uint64_sample_id, "sample_id null (row group 0, row 1): sample_id >= 2**63"),
        (
            lambda d: write(d / "c.parquet", [-5], [np.array([1, 2], np.int32)]),
            "sample_id -5 (row group 0, row 0): sample_id -5 < 0",
        ),
    ],
    ids=["uint64_token", "uint64_sample_id", "negative_sample_id"],
)
def test_out_of_range_ids_are_refused_not_wrapped(cluster, tmp_path, mutate, expected):
    d = dataset(tmp_path, mutate)
    with pytest.raises(DataError) as e:
        build_length_index(cfg_for(d))
    assert f"{d / 'c.parquet'}: {expected}" in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "list_type",
    [pa.list_(pa.int32(), 8), pa.large_list(pa.int64()), pa.list_(pa.uint16())],
    ids=["fixed_size_list", "large_list", "unsigned"],
)
def test_integer_list_layouts_are_indexed_and_delivered(cluster, tmp_path, list_type):
    d = tmp_path / "data"
    d.mkdir()
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, (ROWS, 8))
    ids = np.arange(ROWS, dtype=np.int64)
    pq.write_table(
        pa.table(
            {
                "sample_id": pa.array(ids, pa.int64()),
                "input_ids": pa.array(list(tokens), list_type),
            }
        ),
        d / "a.parquet",
    )
    cfg = cfg_for(d)
    index = build_length_index(cfg)
    assert index.num_samples == ROWS and (index.lengths == 8).all()
    assert np.array_equal(np.sort(_deliver(cfg, index, d)), ids)


# --------------------------------------------------------------------------- rewrites


def _plain(path, ids, tokens):
    """Uncompressed, plain-encoded: same ids and lengths give a file of the same size."""
    table = pa.table(
        {
            "sample_id": pa.array(ids, pa.int64()),
            "input_ids": pa.array(tokens, pa.list_(pa.int32())),
        }
    )
    pq.write_table(table, path, compression="NONE", use_dictionary=False)


def _rewrite_keeping_size_and_mtime(path, change):
    """Other tokens (`change(tokens)`), same sample ids and lengths, same size and mtime."""
    ids = pq.read_table(path)["sample_id"].to_numpy()
    tokens = pq.read_table(path)["input_ids"].to_pylist()
    st = os.stat(path)
    change(tokens)
    _plain(path, ids, tokens)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # as `cp -p` / `rsync -a` leave it
    assert os.stat(path).st_size == st.st_size


def _plain_dataset(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    for f, name in enumerate(("a", "b")):
        ids, tokens = good_rows(f)
        _plain(d / f"{name}.parquet", ids, tokens)
    return d


def test_rewrite_keeping_size_and_mtime_is_rescanned(cluster, tmp_path):
    d = _plain_dataset(tmp_path)
    first = build_length_index(cfg_for(d))
    assert build_length_index(cfg_for(d)).from_cache  # unchanged: the cache answers

    def one_row_out_of_vocab(tokens):
        tokens[3] = [VOCAB + 1] * len(tokens[3])

    _rewrite_keeping_size_and_mtime(d / "b.parquet", one_row_out_of_vocab)
    with pytest.raises(DataError) as e:
        build_length_index(cfg_for(d))
    msg = str(e.value)
    assert f"{d / 'b.parquet'}: sample_id 1003 (row group 0, row 3): token id {VOCAB + 1}" in msg
    assert first.num_samples == 2 * ROWS


def test_shard_rewritten_after_indexing_is_named_when_its_rows_are_read(cluster, tmp_path):
    d = _plain_dataset(tmp_path)
    cfg = cfg_for(d)
    index = build_length_index(cfg)

    def all_fives(tokens):  # valid tokens, same ids and lengths, other values
        tokens[:] = [[5] * len(t) for t in tokens]

    _rewrite_keeping_size_and_mtime(d / "b.parquet", all_fives)
    name = f"messy-rewrite-{tmp_path.name}"
    start_feeder(cfg, index, EDGES, name=name, path=str(d), prefetch=False)
    try:
        with pytest.raises(DataError) as e:
            for _ in rank_batches(name, epoch=0, start_step=0, rank=0, world_size=1):
                pass
    finally:
        stop_feeder(name)
    msg = str(e.value)
    assert f"{d / 'b.parquet'}: row group 0 changed since indexing" in msg, msg


def test_row_group_digests_match_what_delivery_reads_back(cluster, tmp_path):
    d = dataset(tmp_path, lambda d: None)
    pq.write_table(pq.read_table(d / "b.parquet"), d / "b.parquet", row_group_size=15)
    index = build_length_index(cfg_for(d))
    assert [len(g) for g in index.rg_digests] == [1, 3]
    for f, path in enumerate(index.files):
        pf = pq.ParquetFile(path)
        got = [
            input_ids_digest(pf.read_row_group(g)["input_ids"]) for g in range(pf.num_row_groups)
        ]
        assert got == list(index.rg_digests[f])
    assert len(set(index.rg_digests[1])) == 3  # different content, different digests


# --------------------------------------------------------------------------- user errors


def test_single_file_path_with_quarantine_writes_beside_the_file(cluster, tmp_path):
    bad_and_good = [np.array([], np.int32), np.array([1, 2], np.int32)]
    d = dataset(tmp_path, lambda d: write(d / "c.parquet", [7, 8], bad_and_good))
    index = build_length_index(cfg_for(d / "c.parquet", "quarantine"))
    want = str(d / "_bucketray_index" / "quarantine.parquet")
    assert index.quarantine_path == want and os.path.isfile(want)
    assert index.sample_ids.tolist() == [8] and index.num_quarantined == 1
    assert build_length_index(cfg_for(d / "c.parquet", "quarantine")).from_cache


def test_every_row_quarantined_is_refused_with_counts(cluster, tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    write(d / "a.parquet", [1, 2], [np.array([VOCAB], np.int32), np.array([], np.int32)])
    q = tmp_path / "q.parquet"
    with pytest.raises(DataError) as e:
        build_length_index(cfg_for(d, "quarantine", quarantine_path=str(q)))
    msg = str(e.value)
    assert "every row of" in msg and "2 bad rows of 2" in msg and str(q) in msg, msg
    codes = pq.read_table(q)["reason_code"].to_pylist()
    assert codes == [Reason.TOKEN_OVER_VOCAB.name, Reason.EMPTY.name]


# --------------------------------------------------------------------------- flaky storage


def _flaky(monkeypatch, tmp_path, **kw) -> pafs.FileSystem:
    fs = flaky_fs("/a.parquet", tmp_path / "opens.txt", **kw)
    monkeypatch.setattr(pipeline.data.index, "filesystem_for", lambda p: (fs, os.path.abspath(p)))
    return fs


def test_transient_storage_errors_in_the_scan_are_retried_and_counted(
    cluster, tmp_path, monkeypatch
):
    d = dataset(tmp_path, lambda d: None)
    fs = _flaky(
        monkeypatch, tmp_path, fail_count=3, message="AWS Error SLOW_DOWN (HTTP status 503)"
    )
    index = build_length_index(cfg_for(d))
    assert index.num_samples == 2 * ROWS
    # Three failed opens, each retried and counted, then the opens that succeeded.
    assert index.io_retries == 3 and opens(fs) > 3


def test_non_transient_storage_error_names_the_file_and_is_not_retried(
    cluster, tmp_path, monkeypatch
):
    d = dataset(tmp_path, lambda d: None)
    fs = _flaky(
        monkeypatch, tmp_path, fail_count=99, error=PermissionError, message="Permission denied"
    )
    with pytest.raises(DataError) as e:
        build_length_index(cfg_for(d))
    msg = str(e.value)
    assert f"{d / 'a.parquet'}: cannot open the file" in msg and "not retried" in msg, msg
    assert opens(fs) == 1
