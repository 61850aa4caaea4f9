"""The read work list is a typed record (`read.ReadUnits`), and a list column is flattened by one
rule (`pipeline.data.listcolumn`) wherever rows are read, cached or delivered."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline.data.index import LengthIndex
from pipeline.data.listcolumn import flat_values, one_array, values_offsets
from pipeline.data.read import ReadUnits, UnitRows, plan_read_units


def _index() -> LengthIndex:
    # file 0: row groups of 3 and 2 rows; file 1: one of 4 rows (row 1 quarantined)
    return LengthIndex(
        sample_ids=np.array([0, 1, 2, 3, 4, 5, 7, 8], np.int64),
        lengths=np.array([3, 1, 2, 4, 2, 5, 1, 2], np.int32),
        files=["/d/a.parquet", "/d/b.parquet"],
        fingerprint="fp",
        num_quarantined=1,
        file_idx=np.array([0, 0, 0, 0, 0, 1, 1, 1], np.int32),
        rows=np.array([0, 1, 2, 3, 4, 0, 2, 3], np.int64),
        row_groups=((3, 2), (4,)),
        has_sample_id=(True, True),
    )


def test_planned_samples_are_grouped_into_units_of_ascending_rows_with_their_keys():
    sids = np.array([8, 0, 4, 2, 5, 3], np.int64)  # plan order; key i is the i-th planned row
    units = plan_read_units(_index(), sids, np.arange(sids.size, dtype=np.int64))
    assert isinstance(units, ReadUnits) and len(units) == 3
    got = [units.unit(j) for j in range(len(units))]
    assert all(isinstance(u, UnitRows) for u in got)
    assert [(u.file_idx, u.row_group) for u in got] == [(0, 0), (0, 1), (1, 0)]
    assert [u.local_rows.tolist() for u in got] == [[0, 2], [0, 1], [0, 3]]
    assert [u.sample_ids.tolist() for u in got] == [[0, 2], [3, 4], [5, 8]]
    assert [u.keys.tolist() for u in got] == [[1, 3], [5, 2], [4, 0]]
    assert [u.lengths.tolist() for u in got] == [[3, 2], [4, 2], [5, 2]]
    assert units.ptr.tolist() == [0, 2, 4, 6]


def test_a_plan_without_rows_has_no_units():
    units = plan_read_units(_index(), np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert len(units) == 0 and units.ptr.tolist() == [0]


def _lists(rows, chunks=1):
    arr = pa.array(rows, pa.large_list(pa.int32()))
    cut = len(rows) // chunks
    return pa.chunked_array(
        [arr[i * cut : (i + 1) * cut if i < chunks - 1 else None] for i in range(chunks)]
    )


def test_values_and_offsets_give_each_row_its_slice_whatever_the_chunking():
    rows = [[1, 2, 3], [], [4], [5, 6]]
    for chunks in (1, 2):
        values, offsets = values_offsets(_lists(rows, chunks))
        assert offsets.dtype == np.int64 and offsets.size == len(rows) + 1
        assert [
            values[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:], strict=True)
        ] == rows
    sliced = pa.array(rows, pa.large_list(pa.int32()))[1:]  # offsets stay absolute
    values, offsets = values_offsets(sliced)
    assert [values[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:], strict=True)] == rows[
        1:
    ]


def test_one_chunk_is_used_as_is_not_copied():
    col = _lists([[1, 2], [3]])
    assert one_array(col) is col.chunk(0) or one_array(col).equals(col.chunk(0))
    values, offsets = values_offsets(col)
    assert np.shares_memory(values, col.chunk(0).values.to_numpy())
    assert np.shares_memory(offsets, col.chunk(0).offsets.to_numpy())


def test_flat_values_are_the_rows_back_to_back_with_their_lengths():
    rows = [[1, 2, 3], [], [4], [5, 6]]
    sliced = pa.array(rows, pa.list_(pa.int32()))[1:]
    values, lengths = flat_values(sliced)
    assert values.tolist() == [4, 5, 6] and lengths.tolist() == [0, 1, 2]
    values, lengths = flat_values(_lists(rows, 2))
    assert values.tolist() == [1, 2, 3, 4, 5, 6] and lengths.dtype == np.int64
