"""Windowed epochs (`pipeline.core.windows`): every row group in one window per epoch, the
shuffle within each bucket within each window, the carry, the fill, and the contracts kept."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.core.buckets import assign
from pipeline.core.chapters import chapter_read_bytes, plan_chapter_bounds
from pipeline.core.config import (
    TEAM_EDGES,
    ConfigError,
    FixedBatching,
    PlanConfig,
    RunConfig,
    TokenBudgetBatching,
)
from pipeline.core.deliveryconfig import DeliveryConfig
from pipeline.core.packing import pack_epoch, packed_summary
from pipeline.core.plan import epoch_plan
from pipeline.core.ranges import chapter_bounds_for
from pipeline.core.rows import PackingSpec
from pipeline.core.synthetic import seed902k_lengths
from pipeline.core.windows import (
    carried_rows,
    row_group_windows,
    sample_windows,
    windowed_epoch_plan,
    windowed_pack_epoch,
)

RG_ROWS = 256
BUDGET = TokenBudgetBatching(mode="token_budget", token_budget=65536)
SPEC = PackingSpec(row_tokens=8192, rows_per_step=8, attention_width=768)


@pytest.fixture(scope="module")
def corpus():
    """60K samples of the 902K preset's length distribution in 256-row row groups."""
    lengths = seed902k_lengths()[:60_000]
    return lengths, np.arange(lengths.size) // RG_ROWS


def _windows(lengths, rg, n, *, epoch=0, seed=0):
    wt = None if n == 1 else int(lengths.sum() // n) + 1
    return sample_windows(lengths, rg, wt, seed=seed, epoch=epoch)


def _padded(lengths, window, *, epoch=0, world_size=4, batching=BUDGET, plan=None):
    return windowed_epoch_plan(
        lengths,
        TEAM_EDGES,
        window=window,
        epoch=epoch,
        world_size=world_size,
        batching=batching,
        plan=plan or PlanConfig(),
    )


def _packed(lengths, window, *, epoch=0, world_size=4, edges=(0, 8192)):
    return windowed_pack_epoch(
        lengths, list(edges), window=window, seed=0, epoch=epoch, world_size=world_size, spec=SPEC
    )


def test_windows_one_window_is_the_global_plan(corpus):
    lengths, rg = corpus
    one = _windows(lengths, rg, 1)
    assert not one.any()
    for plan in (
        _padded(lengths, one),
        _padded(lengths, sample_windows(lengths, rg, int(lengths.sum()), seed=0, epoch=0)),
    ):
        ref = epoch_plan(lengths, TEAM_EDGES, epoch=0, world_size=4, batching=BUDGET)
        assert plan.content_hash == ref.content_hash and plan.window_steps is None
        assert np.array_equal(plan.sample_ids, ref.sample_ids)
    ref = pack_epoch(lengths, [0, 8192], seed=0, epoch=0, world_size=4, spec=SPEC)
    assert _packed(lengths, one).content_hash == ref.content_hash


def test_windows_every_row_group_in_exactly_one_window_per_epoch(corpus):
    lengths, rg = corpus
    tokens = np.bincount(rg, weights=lengths).astype(np.int64)
    w0 = row_group_windows(tokens, int(tokens.sum() // 8) + 1, seed=0, epoch=0)
    w1 = row_group_windows(tokens, int(tokens.sum() // 8) + 1, seed=0, epoch=1)
    for w in (w0, w1):
        assert w.shape == tokens.shape and set(np.unique(w)) == set(range(8))
        per_window = np.bincount(w, weights=tokens)
        # near-equal real tokens: within one row group of the mean
        assert np.abs(per_window - tokens.sum() / 8).max() <= tokens.max()
    assert not np.array_equal(w0, w1)  # each epoch windows the row groups anew
    again = row_group_windows(tokens, int(tokens.sum() // 8) + 1, seed=0, epoch=0)
    assert np.array_equal(w0, again)


def test_windows_within_bucket_within_window_shuffle_and_carry(corpus):
    """Window w's steps hold window w's samples and what window w-1 carried: at most one
    global batch per bucket, each bucket's carried samples ahead of its own."""
    lengths, rg = corpus
    window = _windows(lengths, rg, 6)
    plan = _padded(lengths, window)
    K = len(TEAM_EDGES) - 1
    ws = plan.window_steps
    assert ws[0] == 0 and ws[-1] == plan.num_steps and ws.size == 7
    seen_windows = []
    for w in range(6):
        lo, hi = plan.step_offsets[ws[w]], plan.step_offsets[ws[w + 1]]
        sw = window[plan.sample_ids[lo:hi]]
        assert set(np.unique(sw)) <= {w - 1, w}
        carried = plan.sample_ids[lo:hi][sw == w - 1]
        steps_with_carry = np.unique(
            np.searchsorted(plan.step_offsets, lo + np.flatnonzero(sw == w - 1), side="right") - 1
        )
        assert steps_with_carry.size <= K  # one batch per bucket at most
        if w:
            assert carried.size > 0
        seen_windows.append(sw)
    # every sample trained once in the epoch (no drop_remainder)
    assert np.array_equal(np.sort(plan.sample_ids), np.arange(lengths.size))
    # within a window and bucket the order differs from id order (a shuffle), per epoch
    other = _padded(lengths, _windows(lengths, rg, 6, epoch=1), epoch=1)
    assert not np.array_equal(other.sample_ids, plan.sample_ids)


def test_windows_contract4_drop_remainder_only_at_the_epochs_end(corpus):
    lengths, rg = corpus
    window = _windows(lengths, rg, 5)
    fixed = FixedBatching(mode="fixed", batch_size=96, drop_remainder=True)
    plan = _padded(lengths, window, batching=fixed)
    ref = epoch_plan(lengths, TEAM_EDGES, epoch=0, world_size=4, batching=fixed)
    # a window's partial batches are carried, not dropped: only the last window drops, at most
    # one partial batch per bucket, as the global plan does
    assert plan.num_dropped < 96 * (len(TEAM_EDGES) - 1)
    assert plan.num_samples + plan.num_dropped == lengths.size
    assert abs(plan.num_steps - ref.num_steps) <= len(TEAM_EDGES) - 1
    assert np.unique(plan.sample_ids).size == plan.num_samples


def test_windows_fill_within_one_percent_of_the_global_plan(corpus):
    lengths, rg = corpus
    glob = _padded(lengths, _windows(lengths, rg, 1)).planned_padding_efficiency()
    glob_packed = packed_summary(_packed(lengths, _windows(lengths, rg, 1)))["row_fill"]
    for n in (4, 16):
        window = _windows(lengths, rg, n)
        assert _padded(lengths, window).planned_padding_efficiency() >= glob - 0.01
        assert packed_summary(_packed(lengths, window))["row_fill"] >= glob_packed - 0.01


def test_windows_contract8_independent_of_the_world_size(corpus):
    lengths, rg = corpus
    window = _windows(lengths, rg, 6)
    for make in (_padded, _packed):
        plans = [make(lengths, window, world_size=w) for w in (1, 2, 4, 8)]
        for p in plans[1:]:
            assert p.content_hash == plans[0].content_hash
            assert np.array_equal(p.sample_ids, plans[0].sample_ids)
            assert np.array_equal(p.step_offsets, plans[0].step_offsets)
            assert np.array_equal(p.window_steps, plans[0].window_steps)
        # each rank's views concatenate, step by step, to the global batches
        p = plans[2]
        views = [p.rank_view(r) for r in range(4)]
        for s in (0, p.num_steps // 2, p.num_steps - 1):
            got = np.concatenate([v.sample_ids[v.offsets[s] : v.offsets[s + 1]] for v in views])
            want = p.sample_ids[p.step_offsets[s] : p.step_offsets[s + 1]]
            assert np.array_equal(np.sort(got), np.sort(want))


def test_windows_contract7_a_resume_slice_keeps_the_windows(corpus):
    lengths, rg = corpus
    plan = _padded(lengths, _windows(lengths, rg, 6))
    s = int(plan.window_steps[2]) + 3
    tail = plan.slice(s)
    assert tail.content_hash == plan.content_hash
    assert np.array_equal(tail.window_steps, plan.window_steps)
    full, part = plan.rank_view(1), tail.rank_view(1)
    assert np.array_equal(part.sample_ids, full.sample_ids[full.offsets[s] :])
    bounds = chapter_bounds_for(plan, DeliveryConfig())
    assert np.array_equal(bounds, plan.window_steps)
    assert np.array_equal(chapter_bounds_for(tail, DeliveryConfig()), plan.window_steps)


def test_windows_read_each_row_group_once_per_epoch(corpus):
    """Each row group is in one window; a window's steps train the rows its row groups hold and
    the few rows the window before carried (held, never read again): one batch per bucket at
    most. Chapters of a global plan instead read nearly every row group each."""
    lengths, rg = corpus
    window = _windows(lengths, rg, 8)
    assert (window == window[np.searchsorted(rg, rg)]).all()  # a row group's samples share one
    plan = _padded(lengths, window)
    carried = carried_rows(plan, window[plan.sample_ids])
    step = np.repeat(np.arange(plan.num_steps), np.diff(plan.step_offsets))
    trained = np.searchsorted(plan.window_steps, step, side="right") - 1
    K = len(TEAM_EDGES) - 1
    for w in range(1, 8):
        held = carried & (trained == w)
        assert 0 < np.unique(step[held]).size <= K
        assert lengths[plan.sample_ids[held]].sum() <= K * BUDGET.token_budget
    assert not carried[trained == 0].any()
    sizes = np.bincount(rg, weights=lengths * 4.0)
    glob = _padded(lengths, _windows(lengths, rg, 1))
    bounds = plan_chapter_bounds(glob, max_steps=-(-glob.num_steps // 8))
    assert chapter_read_bytes(glob, bounds, rg[glob.sample_ids], sizes)["amplification"] > 6
    assert not carried_rows(glob, np.zeros(glob.num_samples, np.int64)).any()


def test_windows_longest_first_puts_the_longest_row_group_first(corpus):
    lengths, rg = corpus
    window = _windows(lengths, rg, 6)
    assert window[int(np.argmax(lengths))] == 0  # its row group leads the permutation
    plan = _padded(lengths, window)
    first_window = plan.lengths[: plan.step_offsets[plan.window_steps[1]]]
    assert int(plan.lengths[: plan.step_offsets[1]].max()) == int(first_window.max())
    later = _padded(lengths, window, plan=PlanConfig(longest_first=False))
    assert int(later.lengths[: later.step_offsets[1]].max()) < int(first_window.max())


def test_windows_refuse_row_groups_too_large_for_a_window():
    tokens = np.array([1000, 50, 60, 70, 80])
    with pytest.raises(ConfigError, match="raise plan.window_tokens to at least 2000"):
        row_group_windows(tokens, 500, seed=0, epoch=0)
    with pytest.raises(ConfigError, match="rewrite the shards"):
        row_group_windows(tokens, 500, seed=0, epoch=0)


def test_windows_config_only_for_the_policies_that_shuffle():
    assert PlanConfig(window_tokens=2**20).window_tokens == 2**20
    with pytest.raises(ValueError, match="remove plan.window_tokens"):
        RunConfig.model_validate(
            {"data": {"path": "d"}, "plan": {"policy": "sorted", "window_tokens": 2**20}}
        )
    with pytest.raises(ValueError, match="remove delivery.chapter_steps"):
        RunConfig.model_validate(
            {
                "data": {"path": "d"},
                "plan": {"window_tokens": 2**20},
                "delivery": {"chapter_steps": 10},
            }
        )
    # `random` is one bucket, shuffled within each window
    lengths = seed902k_lengths()[:20_000]
    rg = np.arange(lengths.size) // RG_ROWS
    plan = _padded(lengths, _windows(lengths, rg, 4), plan=PlanConfig(policy="random"))
    assert plan.num_buckets == 1 and plan.window_steps.size == 5


def test_windows_packed_steps_are_whole_but_the_last(corpus):
    lengths, rg = corpus
    window = _windows(lengths, rg, 6)
    plan = _packed(lengths, window, edges=(0, 1216, 8192))
    rows_per_step = np.diff(plan.rows.step_rows)
    assert (rows_per_step[:-1] == SPEC.rows_per_step).all()
    assert np.array_equal(np.sort(plan.sample_ids), np.arange(lengths.size))
    # each row holds one bucket's samples (packing within buckets, within windows)
    b = assign(plan.lengths, [0, 1216, 8192])
    row = np.repeat(np.arange(plan.rows.num_rows), np.diff(plan.rows.row_offsets))
    assert all(np.unique(b[row == r]).size == 1 for r in range(0, plan.rows.num_rows, 97))
