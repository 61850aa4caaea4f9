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
non_parquet_file cases.)

Each case also runs windowed (`plan.window_tokens`; six shards of two row groups, four windows):
the shard that goes bad is one that a window other than the first reads, and every epoch that
trains is its plan, rank by rank, with nothing lost or repeated."""

from __future__ import annotations

import uuid

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.core.config import RunConfig
from pipeline.core.epochs import epoch_windows
from pipeline.data import (
    build_length_index,
    epoch_plan_for,
    rank_batches,
    start_feeder,
    stop_feeder,
)
from tests.ray.test_bad_input import EDGES, ROWS, cfg_for, good_rows, write

pytestmark = [pytest.mark.ray, pytest.mark.slow]

# Windowed: six shards of two row groups each (~650 real tokens a row group, ~7,700 in all),
# cut into windows of about WINDOW_TOKENS: four windows of each epoch's plan at two workers.
WINDOW_FILES, WINDOW_GROUP_ROWS, WINDOW_TOKENS = "abcdef", ROWS // 2, 2000
WINDOWS = pytest.mark.parametrize("windowed", [False, True], ids=["global", "windowed"])


def _write(path, f: int, seed: int = 0, *, windowed: bool = False) -> None:
    """Shard `f` (sample ids 1000 * f + row); windowed, in row groups of WINDOW_GROUP_ROWS."""
    write(path, *good_rows(f, seed=seed))
    if windowed:
        pq.write_table(pq.read_table(path), path, row_group_size=WINDOW_GROUP_ROWS)


def _names(windowed: bool) -> str:
    """The shards' names (a.parquet, b.parquet, ...)."""
    return WINDOW_FILES if windowed else "ab"


def _shards(tmp_path, windowed: bool = False):
    d = tmp_path / "data"
    d.mkdir()
    for f, name in enumerate(_names(windowed)):
        _write(d / f"{name}.parquet", f, windowed=windowed)
    return d


def _cfg(d, windowed: bool, *args, **kw) -> RunConfig:
    """`cfg_for`, and windowed: the plan cut into windows of about WINDOW_TOKENS."""
    cfg = cfg_for(d, *args, **kw)
    if not windowed:
        return cfg
    return RunConfig.model_validate(cfg.model_dump() | {"plan": {"window_tokens": WINDOW_TOKENS}})


def _epoch(name: str, epoch: int) -> np.ndarray:
    return np.concatenate(
        [
            mb.sample_ids
            for r in range(2)
            for mb in rank_batches(name, epoch=epoch, start_step=0, rank=r, world_size=2)
        ]
    )


def _exact_epoch(name: str, cfg: RunConfig, index, epoch: int) -> np.ndarray:
    """Each rank's micro-batches of `epoch`, asserted to be exactly its planned ones, in order
    (nothing lost or repeated, windows or not); all the sample ids trained."""
    plan = epoch_plan_for(cfg, index, EDGES, epoch, 2)
    for r in range(2):
        view = plan.rank_view(r)
        got = list(rank_batches(name, epoch=epoch, start_step=0, rank=r, world_size=2))
        assert [mb.step for mb in got] == list(range(plan.num_steps)), r
        for m, mb in enumerate(got):
            want = view.sample_ids[view.offsets[m] : view.offsets[m + 1]]
            assert np.array_equal(mb.sample_ids, want), (epoch, r, m)
    return plan.sample_ids


def _later_window_shard(cfg: RunConfig, index, epoch: int) -> tuple[int, int]:
    """(shard, first step of the window first reading it): the shard replaced, in its rows'
    first window of `epoch` at two workers; windowed, the earliest among the shards not read by
    the first window, which must be inside a plan of several windows."""
    ws = epoch_plan_for(cfg, index, EDGES, epoch, 2).window_steps
    if ws is None:
        return 1, 0  # b.parquet, all read at once
    assert ws.size - 1 >= 2, f"expected several windows: {ws}"
    w = epoch_windows(cfg, index, epoch)
    first = {f: int(w[index.file_idx == f].min()) for f in range(len(WINDOW_FILES))}
    f = min((f for f in first if first[f] >= 1), key=first.get)
    assert ws[first[f]] < ws[first[f] + 1], ws  # a window that trains steps: not the first
    return f, int(ws[first[f]])


def _truncate(path, f: int, windowed: bool):
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])


def _other_rows(path, f: int, windowed: bool):
    _write(path, f, seed=1, windowed=windowed)  # the same sample ids, other lengths and tokens


@WINDOWS
@pytest.mark.parametrize("replace", [_truncate, _other_rows], ids=["unreadable", "other_rows"])
def test_contract10_shard_replaced_between_epochs_names_the_file(
    local_ray, tmp_path, replace, windowed
):
    """Windowed, the shard replaced is first read by a window that is not the first of epoch 1:
    its steps before that window are delivered, exactly, and then the read stops."""
    d = _shards(tmp_path, windowed)
    cfg = _cfg(d, windowed, delivery={"row_cache": False, "lead_tokens": None})
    index = build_length_index(cfg)
    f, fails_at = _later_window_shard(cfg, index, 1)
    bad = d / f"{_names(windowed)[f]}.parquet"
    name = f"replaced-{uuid.uuid4().hex[:6]}"
    start_feeder(cfg, index, EDGES, name=name, path=str(d), prefetch=False)
    steps = []
    try:
        assert np.array_equal(np.sort(_exact_epoch(name, cfg, index, 0)), index.sample_ids)
        replace(bad, f, windowed)
        with pytest.raises(Exception) as e:
            for mb in rank_batches(name, epoch=1, start_step=0, rank=0, world_size=2):
                steps.append(mb.step)
    finally:
        stop_feeder(name)
    msg = str(e.value)
    assert str(bad) in msg and "since indexing" in msg, msg[-2000:]
    if windowed:  # the windows before it delivered whole, nothing of the one reading the shard
        assert steps == list(range(fails_at)), (steps, fails_at)


@WINDOWS
@pytest.mark.parametrize("replace", [_truncate, _other_rows], ids=["unreadable", "other_rows"])
def test_contract10_shard_replaced_between_epochs_trains_the_indexed_rows_and_the_next_start_names_it(
    local_ray, tmp_path, replace, windowed
):
    """Windowed, the shard replaced is first read by a window that is not the first of epoch 1;
    the epoch is still its plan, rank by rank, from the rows cached when the run indexed (the
    row cache asked for: with windows it is off unless set)."""
    from pipeline.data import DataError
    from pipeline.train.resume_check import data_file_digests

    d = _shards(tmp_path, windowed)
    rows = {"row_cache": True, "row_cache_dir": str(tmp_path / "rows")}
    cfg = _cfg(d, windowed, delivery=rows)
    index = build_length_index(cfg)
    f, _ = _later_window_shard(cfg, index, 1)
    bad = f"{_names(windowed)[f]}.parquet"
    name = f"cached-{uuid.uuid4().hex[:6]}"
    start_feeder(cfg, index, EDGES, name=name, path=str(d), prefetch=False)
    try:
        _epoch(name, 0)
        replace(d / bad, f, windowed)
        # The rows the plan indexed, verified against the index's digests when they were cached.
        assert np.array_equal(np.sort(_exact_epoch(name, cfg, index, 1)), index.sample_ids)
    finally:
        stop_feeder(name)
    before = data_file_digests(index)
    try:
        after = data_file_digests(build_length_index(cfg))
    except DataError as e:  # the unreadable file, named
        assert str(d / bad) in str(e)
        return
    changed = {p for p in before if before[p] != after.get(p)}
    assert changed == {bad}, (before, after)


@WINDOWS
def test_contract10_unreadable_shard_is_counted_when_reindexed_under_quarantine(
    local_ray, tmp_path, windowed
):
    """Windowed, the shard that goes bad is one a later window read, and the windows planned
    over the rest (several) train each of its rows exactly once, rank by rank."""
    d = _shards(tmp_path, windowed)
    before = _cfg(d, windowed)
    f, _ = _later_window_shard(before, build_length_index(before), 0)
    bad = f"{_names(windowed)[f]}.parquet"
    _truncate(d / bad, f, windowed)
    qpath = tmp_path / "q.parquet"
    cfg = _cfg(d, windowed, "quarantine", quarantine_path=str(qpath))
    index = build_length_index(cfg)  # the changed fingerprint forces a rescan
    (rec,) = pq.read_table(qpath).to_pylist()
    assert index.num_quarantined == 1 and rec["file"].endswith(bad)
    assert "not a readable parquet file" in rec["reason"]
    rest = [g for g in range(len(_names(windowed))) if g != f]
    want = np.sort(np.concatenate([good_rows(g)[0] for g in rest]))  # all of the other shards
    if windowed:
        ws = epoch_plan_for(cfg, index, EDGES, 0, 2).window_steps
        assert ws is not None and ws.size - 1 >= 2, ws
    name = f"requarantined-{uuid.uuid4().hex[:6]}"
    start_feeder(cfg, index, EDGES, name=name, path=str(d), prefetch=False)
    try:
        assert np.array_equal(np.sort(_exact_epoch(name, cfg, index, 0)), want)
    finally:
        stop_feeder(name)
