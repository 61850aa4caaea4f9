"""Contract 10 for shards that go bad after indexing: a run never trains on what its plan did not
index. A file replaced between epochs by an unreadable one, or by one with other rows:
- read from parquet (`delivery.row_cache: false`), it stops the next epoch's read with an error
  naming the file;
- with the row cache (the default), the next epoch is served from the rows decoded and verified
  when the run indexed them -- the data the plan was made from -- and the next start or resume
  of the run rescans the changed file and names it (an unreadable one is refused; other rows
  change its digest, which a resume refuses naming the file: tests/ray/test_driver_control.py).
Re-indexing under `data.on_bad_rows=quarantine` then counts the file and trains on the rest.
(Corrupt shards found at index time: tests/ray/test_bad_input.py, truncated_file and
non_parquet_file cases.)"""

from __future__ import annotations

import uuid

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.data import build_length_index, rank_batches, start_feeder, stop_feeder
from tests.ray.test_bad_input import EDGES, ROWS, cfg_for, good_rows, write

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _shards(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    for f, name in enumerate(("a", "b")):
        write(d / f"{name}.parquet", *good_rows(f))
    return d


def _epoch(name: str, epoch: int) -> np.ndarray:
    return np.concatenate(
        [
            mb.sample_ids
            for r in range(2)
            for mb in rank_batches(name, epoch=epoch, start_step=0, rank=r, world_size=2)
        ]
    )


def _truncate(path):
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])


def _other_rows(path):
    ids, tokens = good_rows(1, seed=1)  # the same sample ids, other lengths and tokens
    write(path, ids, tokens)


@pytest.mark.parametrize("replace", [_truncate, _other_rows], ids=["unreadable", "other_rows"])
def test_contract10_shard_replaced_between_epochs_names_the_file(local_ray, tmp_path, replace):
    d = _shards(tmp_path)
    cfg = cfg_for(d, delivery={"row_cache": False})
    index = build_length_index(cfg)
    name = f"replaced-{uuid.uuid4().hex[:6]}"
    start_feeder(cfg, index, EDGES, name=name, path=str(d), prefetch=False)
    try:
        assert np.array_equal(np.sort(_epoch(name, 0)), index.sample_ids)
        replace(d / "b.parquet")
        with pytest.raises(Exception) as e:
            _epoch(name, 1)
    finally:
        stop_feeder(name)
    msg = str(e.value)
    assert str(d / "b.parquet") in msg and "since indexing" in msg, msg[-2000:]


@pytest.mark.parametrize("replace", [_truncate, _other_rows], ids=["unreadable", "other_rows"])
def test_contract10_shard_replaced_between_epochs_trains_the_indexed_rows_and_the_next_start_names_it(
    local_ray, tmp_path, replace
):
    from pipeline.data import DataError
    from pipeline.train.resume_check import data_file_digests

    d = _shards(tmp_path)
    cfg = cfg_for(d, delivery={"row_cache_dir": str(tmp_path / "rows")})
    index = build_length_index(cfg)
    name = f"cached-{uuid.uuid4().hex[:6]}"
    start_feeder(cfg, index, EDGES, name=name, path=str(d), prefetch=False)
    try:
        _epoch(name, 0)
        replace(d / "b.parquet")
        # The rows the plan indexed, verified against the index's digests when they were cached.
        assert np.array_equal(np.sort(_epoch(name, 1)), index.sample_ids)
    finally:
        stop_feeder(name)
    before = data_file_digests(index)
    try:
        after = data_file_digests(build_length_index(cfg))
    except DataError as e:  # the unreadable file, named
        assert str(d / "b.parquet") in str(e)
        return
    changed = {f for f in before if before[f] != after.get(f)}
    assert changed == {"b.parquet"}, (before, after)


def test_contract10_unreadable_shard_is_counted_when_reindexed_under_quarantine(
    local_ray, tmp_path
):
    d = _shards(tmp_path)
    build_length_index(cfg_for(d))
    _truncate(d / "b.parquet")
    qpath = tmp_path / "q.parquet"
    cfg = cfg_for(d, "quarantine", quarantine_path=str(qpath))
    index = build_length_index(cfg)  # the changed fingerprint forces a rescan
    (rec,) = pq.read_table(qpath).to_pylist()
    assert index.num_quarantined == 1 and rec["file"].endswith("b.parquet")
    assert "not a readable parquet file" in rec["reason"]
    name = f"requarantined-{uuid.uuid4().hex[:6]}"
    start_feeder(cfg, index, EDGES, name=name, path=str(d), prefetch=False)
    try:
        assert np.array_equal(np.sort(_epoch(name, 0)), np.arange(ROWS))  # all of a.parquet
    finally:
        stop_feeder(name)
