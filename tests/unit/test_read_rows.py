"""The read task without Ray: planned rows of one row group, checked against the index and model.

Token values are range-checked where they are read, on the file's own dtype; a transient read
error is retried and counted; only a difference in ids or lengths is called a changed file.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from pipeline.core.collate import IGNORE_INDEX
from pipeline.data import DataError
from pipeline.data.read import ReadSpec, read_row_group
from pipeline.data.retry import RetryPolicy, StorageUnavailableError
from tests.flaky_fs import flaky_fs

VOCAB = 100
ROWS, PER_GROUP = 30, 10
NO_WAIT = RetryPolicy(attempts=3, backoff_s=0.0)


def _write(path, tokens, *, id_type=None, labels=None):
    cols = {
        "sample_id": pa.array(np.arange(len(tokens), dtype=np.int64) + 1000),
        "input_ids": pa.array(tokens, pa.list_(id_type or pa.int32())),
    }
    if labels is not None:
        cols["labels"] = pa.array(labels, pa.list_(pa.int64()))
    pq.write_table(pa.table(cols), path, row_group_size=PER_GROUP)
    return str(path)


def _tokens(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, int(n)).tolist() for n in rng.integers(1, 20, ROWS)]


def _read(path, tokens, g, fs=None, supervision="", retry=NO_WAIT):
    """read_row_group for all rows of row group g, as the plan would ask for them."""
    spec = ReadSpec((path,), (True,), supervision, None, VOCAB, retry)
    rows = np.arange(g * PER_GROUP, (g + 1) * PER_GROUP)
    lengths = np.array([len(tokens[i]) for i in rows])
    return read_row_group(
        fs or pafs.LocalFileSystem(), spec, 0, g, rows - g * PER_GROUP, rows, rows + 1000, lengths
    )


def test_planned_rows_come_back_keyed_with_their_tokens(tmp_path):
    tokens = _tokens()
    t, retries = _read(_write(tmp_path / "a.parquet", tokens), tokens, 1)
    assert retries == 0 and t["key"].to_pylist() == list(range(10, 20))
    assert t["input_ids"].to_pylist() == tokens[10:20]


@pytest.mark.parametrize(
    "id_type, bad",
    [(pa.uint64(), 2**63 + 5), (pa.int64(), -7), (pa.int32(), VOCAB)],
    ids=["uint64_at_least_2_63", "negative", "vocab_size"],
)
def test_token_out_of_range_names_file_row_group_row_and_sample(tmp_path, id_type, bad):
    tokens = _tokens()
    tokens[14][2] = bad  # row group 1, row 4, sample_id 1014
    path = _write(tmp_path / "a.parquet", tokens, id_type=id_type)
    with pytest.raises(DataError) as e:
        _read(path, tokens, 1)
    assert str(e.value).startswith(
        f"{path}: row group 1 row 4 (sample_id 1014) has token value {bad} outside "
        f"[0, model.vocab_size={VOCAB})"
    )


def test_labels_out_of_range_are_refused_and_ignore_index_is_not(tmp_path):
    tokens = _tokens()
    labels = [[IGNORE_INDEX, *r[1:]] for r in tokens]
    path = _write(tmp_path / "a.parquet", tokens, labels=labels)
    t, _ = _read(path, tokens, 0, supervision="labels")
    assert t["sup"].to_pylist() == labels[:10]
    labels[25][0] = VOCAB + 1
    path = _write(tmp_path / "b.parquet", tokens, labels=labels)
    with pytest.raises(DataError, match=r"row group 2 row 5 \(sample_id 1025\) has labels value"):
        _read(path, tokens, 2, supervision="labels")


def test_transient_errors_are_retried_and_counted(tmp_path):
    tokens = _tokens()
    path = _write(tmp_path / "a.parquet", tokens)
    fs = flaky_fs("a.parquet", tmp_path / "opens", 2, error=ConnectionResetError)
    t, retries = _read(path, tokens, 2, fs=fs)
    assert retries == 2 and t["input_ids"].to_pylist() == tokens[20:30]


def test_storage_that_stays_down_is_an_outage_not_a_changed_file(tmp_path):
    tokens = _tokens()
    path = _write(tmp_path / "a.parquet", tokens)
    fs = flaky_fs("a.parquet", tmp_path / "opens", 99, error=ConnectionResetError)
    with pytest.raises(StorageUnavailableError) as e:
        _read(path, tokens, 0, fs=fs)
    assert f"{path}: row group 0: 3 attempts" in str(e.value) and "changed" not in str(e.value)


def test_unreadable_file_is_named_without_claiming_its_rows_changed(tmp_path):
    tokens = _tokens()
    path = tmp_path / "a.parquet"
    _write(path, tokens)
    path.write_bytes(path.read_bytes()[:100])  # truncated after indexing
    with pytest.raises(DataError, match=f"{path}: row group 0 became unreadable since indexing"):
        _read(str(path), tokens, 0)


def test_other_length_is_a_changed_file(tmp_path):
    tokens = _tokens()
    path = _write(tmp_path / "a.parquet", tokens)
    tokens[3] = tokens[3] + [1]  # what the index recorded differs from the file
    with pytest.raises(DataError, match=r"row 3 \(sample_id 1003\) has length .* changed since"):
        _read(path, tokens, 0)
