"""A windowed epoch's carried rows between windows' passes (`pipeline.data.carry`): which rows a
range takes held and which it carries out, the re-keying of held rows, and a lost held part read
again from its row groups."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipeline.core.config import TEAM_EDGES, DeliveryConfig, PlanConfig, TokenBudgetBatching
from pipeline.core.ranges import chapter_bounds_for
from pipeline.core.synthetic import seed902k_lengths
from pipeline.core.windows import (
    carried_rows,
    sample_windows,
    trained_windows,
    windowed_epoch_plan,
)
from pipeline.data import prepare as prep
from pipeline.data.carry import CarryBook, rekey

N, RG = 20_000, 128


def _plan():
    lengths = seed902k_lengths()[:N]
    window = sample_windows(
        lengths, np.arange(N) // RG, int(lengths.sum() // 5) + 1, seed=0, epoch=0
    )
    plan = windowed_epoch_plan(
        lengths,
        TEAM_EDGES,
        window=window,
        epoch=0,
        world_size=2,
        batching=TokenBudgetBatching(mode="token_budget", token_budget=65536),
        plan=PlanConfig(),
    )
    return plan, window


class _Part:
    def size_bytes(self):
        return 10


def test_carry_each_window_carries_out_what_the_next_takes_held():
    plan, window = _plan()
    book = CarryBook(lambda epoch: window, np.arange(N))
    read = window[plan.sample_ids]
    carried = carried_rows(plan, read)
    trained = trained_windows(plan)
    ws = plan.window_steps
    for w in range(ws.size - 1):
        rc = book.plan_range(plan, int(ws[w]), int(ws[w + 1]))
        lo, hi = plan.step_offsets[ws[w]], plan.step_offsets[ws[w + 1]]
        assert rc.window == w
        # what window w carries out: every row read so far that a later window trains
        want_out = plan.sample_ids[(read <= w) & (trained > w)]
        assert np.array_equal(np.sort(rc.out_sids), np.sort(want_out))
        assert (rc.out_sids.size > 0) == (w < ws.size - 2) and rc.into == (
            w + 1 if w < ws.size - 2 else -1
        )
        # what it takes held: every carried-in row, once the window before kept them
        assert np.array_equal(rc.held, carried[lo:hi]) and (rc.num_held > 0) == (w > 0)
        book.keep(0, w + 1, _Part(), rc.out_sids, w)
    # only the last two windows' parts are held
    assert sorted(book._held) == [(0, ws.size - 2), (0, ws.size - 1)]


def _simulate_epoch(plan, window, lose=None):
    """The carry book driven through an epoch's chapters as the preparer drives it, each pass's
    rows counted by source: {sample id: times read from its row group}, and every range's rows
    checked to come from a read or from what is held. `lose`: a window whose held part is lost
    before its pass (read again from the row groups)."""
    book = CarryBook(lambda epoch: window, np.arange(N))
    reads, gone = np.zeros(N, dtype=np.int64), np.zeros(0, dtype=np.int64)
    bounds = chapter_bounds_for(plan, DeliveryConfig())
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        rc = book.plan_range(plan, int(a), int(b))
        if lose is not None and rc.window == lose and rc.part is not None:
            gone = book._held[(0, rc.window)][1]
            book.forget(0, rc.window)
            rc = book.plan_range(plan, int(a), int(b))
        lo, hi = plan.step_offsets[a], plan.step_offsets[b]
        sids = plan.sample_ids[lo:hi]
        held = set() if rc.part is None else set(book._held[(0, rc.window)][1].tolist())
        taken = np.concatenate([sids[rc.held], rc.out_sids[rc.out_held]])
        assert set(taken.tolist()) <= held  # what is taken is held
        np.add.at(reads, np.concatenate([sids[~rc.held], rc.out_sids[~rc.out_held]]), 1)
        if rc.out_sids.size:
            assert rc.into > rc.window
            book.keep(0, rc.into, _Part(), rc.out_sids, rc.window)
    return reads, gone


@pytest.mark.parametrize("windows, budget", [(16, 65536), (32, 262144)])
def test_carry_rows_carried_on_for_several_windows_are_read_once(windows, budget):
    """Many buckets in small windows: a bucket with less than a batch in a window carries it on
    again (rows train several windows after their own), and with a larger budget some windows
    train no step at all. Every row is still read exactly once per epoch, and after a lost held
    part, the rows it held are read once more, and no other."""
    lengths = seed902k_lengths()[:N]
    edges = np.unique(np.quantile(lengths, np.linspace(0, 1, 49)).astype(np.int64))
    edges[0], edges[-1] = 0, max(int(edges[-1]), int(lengths.max()))
    window = sample_windows(
        lengths, np.arange(N) // RG, int(lengths.sum() // windows) + 1, seed=0, epoch=0
    )
    plan = windowed_epoch_plan(
        lengths,
        edges,
        window=window,
        epoch=0,
        world_size=2,
        batching=TokenBudgetBatching(mode="token_budget", token_budget=budget),
        plan=PlanConfig(),
    )
    late = trained_windows(plan) - window[plan.sample_ids]
    assert late.max() > 1  # the case itself: rows trained two or more windows late
    if budget > 65536:
        assert (np.diff(plan.window_steps) == 0).any()  # and windows that train no step
    reads, _ = _simulate_epoch(plan, window)
    assert np.array_equal(reads[plan.sample_ids], np.ones(plan.num_samples, dtype=np.int64))
    lost, gone = _simulate_epoch(plan, window, lose=int(np.median(trained_windows(plan))))
    assert gone.size and lost.min() == 1 and lost.max() == 2
    assert np.array_equal(np.flatnonzero(lost > 1), np.sort(gone))  # exactly the lost rows


def test_carry_nothing_held_reads_the_carried_in_rows():
    plan, window = _plan()
    book = CarryBook(lambda epoch: window, np.arange(N))
    ws = plan.window_steps
    rc = book.plan_range(plan, int(ws[2]) + 1, int(ws[3]))  # a fresh feeder, mid-window
    assert rc.num_held == 0 and rc.part is None and rc.out_sids.size > 0
    book.keep(0, 3, _Part(), rc.out_sids, 2)
    book.forget(0, 3)
    assert book.plan_range(plan, int(ws[3]), int(ws[4])).num_held == 0


def test_carry_rekey_gives_held_rows_their_keys_and_drops_the_rest():
    t = pa.table(
        {
            "key": pa.array([100, 101, 102, 103], pa.int64()),
            "sample_id": pa.array([7, 3, 9, 5], pa.int64()),
            "input_ids": pa.array([[1], [2, 2], [3], [4]], pa.large_list(pa.int32())),
        }
    )
    out = rekey(t, np.array([5, 7, 11]), np.array([0, 4, 2]))
    assert out["sample_id"].to_pylist() == [7, 5]
    assert out["key"].to_pylist() == [4, 0]
    assert out["input_ids"].to_pylist() == [[1], [4]]


def test_carry_a_lost_held_part_is_read_from_its_row_groups(monkeypatch):
    """The pass with a held part fails (its blocks lost with a node): the range is prepared
    again with every row read, and what it carries out is still kept."""
    plan, window = _plan()
    preparer = prep.RangePreparer.__new__(prep.RangePreparer)
    preparer.carry = CarryBook(lambda epoch: window, np.arange(N))

    class Index:
        sample_ids = np.arange(N)

    preparer.index, preparer.fs, preparer.spec = Index(), None, None
    calls = []

    def fake_parts(fs, spec, plan, units, rank_rows, block_rows, key, held=None, carry_out=0):
        calls.append((held is not None, carry_out))
        if held is not None:
            raise RuntimeError("ObjectLostError: the held part's blocks are gone")
        return [f"rank{r}" for r in range(rank_rows.size)] + (["carry"] if carry_out else [])

    monkeypatch.setattr(prep, "sorted_parts", fake_parts)
    monkeypatch.setattr(prep, "plan_read_units", lambda index, sids, keys: sids)
    ws = plan.window_steps
    full_carry = preparer.carry.plan_range(plan, int(ws[1]), int(ws[2]))
    preparer.carry.keep(0, 2, _Part(), full_carry.out_sids, 1)
    sub = plan.slice(int(ws[2]), int(ws[3]))
    keys, rank_rows = sub.sort_keys()
    rc = preparer.carry.plan_range(plan, int(ws[2]), int(ws[3]))
    assert rc.num_held > 0
    key = prep.RangeKey(0, 2, int(ws[2]), int(ws[3]))
    parts, sids = preparer._windowed_parts(sub, keys, rank_rows, 1000, key, rc)
    assert calls == [(True, rc.out_sids.size), (False, rc.out_sids.size)]
    assert parts == ["rank0", "rank1"]
    # the second pass read every row of the range, and the rows it carries out
    assert sids.size == sub.num_samples + rc.out_sids.size
    assert (0, 2) not in preparer.carry._held and preparer.carry._held[(0, 3)][0] == "carry"
