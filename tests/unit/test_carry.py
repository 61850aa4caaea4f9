"""A windowed epoch's carried rows between windows' passes (`pipeline.data.carry`): which rows a
range takes held and which it carries out, the re-keying of held rows, and a lost held part read
again from its row groups."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline.core.config import TEAM_EDGES, PlanConfig, TokenBudgetBatching
from pipeline.core.synthetic import seed902k_lengths
from pipeline.core.windows import carried_rows, sample_windows, windowed_epoch_plan
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
    carried = carried_rows(plan, window[plan.sample_ids])
    ws = plan.window_steps
    for w in range(ws.size - 1):
        rc = book.plan_range(plan, int(ws[w]), int(ws[w + 1]))
        lo, hi = plan.step_offsets[ws[w]], plan.step_offsets[ws[w + 1]]
        assert rc.window == w
        # what window w carries out: the rows it reads that window w + 1 trains
        want_out = plan.sample_ids[carried & (window[plan.sample_ids] == w)]
        assert np.array_equal(np.sort(rc.out_sids), np.sort(want_out))
        assert (rc.out_sids.size > 0) == (w < ws.size - 2)
        # what it takes held: every carried-in row, once the window before kept them
        assert np.array_equal(rc.held, carried[lo:hi]) and (rc.num_held > 0) == (w > 0)
        book.keep(0, w + 1, _Part(), rc.out_sids)
    # only the last two windows' parts are held
    assert sorted(book._held) == [(0, ws.size - 2), (0, ws.size - 1)]


def test_carry_nothing_held_reads_the_carried_in_rows():
    plan, window = _plan()
    book = CarryBook(lambda epoch: window, np.arange(N))
    ws = plan.window_steps
    rc = book.plan_range(plan, int(ws[2]) + 1, int(ws[3]))  # a fresh feeder, mid-window
    assert rc.num_held == 0 and rc.part is None and rc.out_sids.size > 0
    book.keep(0, 3, _Part(), rc.out_sids)
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
    preparer.carry.keep(0, 2, _Part(), full_carry.out_sids)
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
