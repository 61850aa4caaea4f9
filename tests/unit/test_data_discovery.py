"""Shard discovery (data.glob, data.split, top-level default) and the scan's retry rule, without
Ray: list_shards on a local directory, is_transient/retrying on made-up errors."""

from __future__ import annotations

import errno

import pyarrow.fs as pafs
import pytest

from pipeline.data import retry
from pipeline.data.errors import DataError
from pipeline.data.fs import list_shards, split_of


def _tree(root, names):
    for n in names:
        p = root / n
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
    return str(root)


def _rel(root, infos):
    return [i.path[len(root) + 1 :] for i in infos]


def test_default_is_the_top_directory_only_without_markers(tmp_path):
    root = _tree(
        tmp_path,
        ["part-0.parquet", "part-1.parquet", "old/part-0.parquet", "_SUCCESS", ".hidden.parquet"],
    )
    assert _rel(root, list_shards(pafs.LocalFileSystem(), root)) == [
        "part-0.parquet",
        "part-1.parquet",
    ]


def test_glob_star_stays_in_a_folder_and_double_star_crosses_them(tmp_path):
    root = _tree(tmp_path, ["a.parquet", "x/b.parquet", "x/y/c.parquet", "x/_tmp/d.parquet"])
    fs = pafs.LocalFileSystem()
    assert _rel(root, list_shards(fs, root, glob="x/*.parquet")) == ["x/b.parquet"]
    assert _rel(root, list_shards(fs, root, glob="**/*.parquet")) == [
        "a.parquet",
        "x/b.parquet",
        "x/y/c.parquet",
    ]


def test_split_names_are_recognised():
    assert split_of("train-00000-of-00004.parquet") == "train"
    assert split_of("data/validation-00000.parquet") == "validation"
    assert split_of("test.parquet") == "test"
    assert split_of("value-00000.parquet") is None and split_of("part-0.parquet") is None


def test_mixed_splits_are_refused_and_data_split_picks_one(tmp_path):
    root = _tree(tmp_path, ["train-00000.parquet", "train-00001.parquet", "test-00000.parquet"])
    fs = pafs.LocalFileSystem()
    with pytest.raises(DataError) as e:
        list_shards(fs, root)
    msg = str(e.value)
    assert "train-00000.parquet" in msg and "test-00000.parquet" in msg
    assert "data.split=train" in msg
    assert _rel(root, list_shards(fs, root, split="train")) == [
        "train-00000.parquet",
        "train-00001.parquet",
    ]
    with pytest.raises(DataError, match="no shards of split 'validation'"):
        list_shards(fs, root, split="validation")


def test_shards_only_in_subfolders_are_refused_naming_data_glob(tmp_path):
    root = _tree(tmp_path, ["data/train-0.parquet"])
    with pytest.raises(
        DataError, match=r"1 file\(s\) in subfolders \(data/train-0.parquet\).*data.glob"
    ):
        list_shards(pafs.LocalFileSystem(), root)


@pytest.mark.parametrize(
    "err,transient",
    [
        (OSError("AWS Error SLOW_DOWN during GetObject operation: Please reduce your rate"), True),
        (OSError("AWS Error UNKNOWN (HTTP status 503) during HeadObject operation"), True),
        (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), True),
        (TimeoutError("timed out"), True),
        (PermissionError(errno.EACCES, "Permission denied"), False),
        (FileNotFoundError(errno.ENOENT, "No such file"), False),
        (ValueError("Parquet magic bytes not found"), False),
    ],
)
def test_transient_errors_are_told_apart(err, transient):
    assert retry.is_transient(err) is transient


def test_retrying_counts_retries_and_gives_up():
    policy = retry.RetryPolicy(attempts=5, backoff_s=0.0)
    calls, counter = [], [0]

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise OSError("503 Service Unavailable")
        return "ok"

    assert retry.retrying(flaky, counter, policy) == "ok" and counter == [2]

    def always():
        raise OSError("503 Service Unavailable")

    counter = [0]
    with pytest.raises(OSError):
        retry.retrying(always, counter, retry.RetryPolicy(attempts=4, backoff_s=0.0))
    assert counter == [3]

    def denied():
        raise PermissionError("denied")

    counter = [0]
    with pytest.raises(PermissionError):
        retry.retrying(denied, counter, policy)
    assert counter == [0]
