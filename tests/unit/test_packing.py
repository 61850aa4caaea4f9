"""Packed epochs: every sample once, whole, deterministic, world-size independent, balanced, no trend."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core.config import TEAM_EDGES, ConfigError
from pipeline.core.packing import (
    PackingSpec,
    best_fit_rows,
    doc_cost,
    pack_epoch,
    packed_summary,
    rank_costs,
    row_costs,
)
from pipeline.core.rows import check_world_size
from pipeline.core.synthetic import seed902k_lengths

LENGTHS = seed902k_lengths(20_000, seed=3)


def _spec(**kw) -> PackingSpec:
    return PackingSpec(
        **{"row_tokens": 8192, "rows_per_step": 64, "attention_width": 6 * 256, **kw}
    )


def _rank_samples(plan, rank):
    mo = plan.micro_offsets
    return [plan.sample_ids[mo[s, rank] : mo[s, rank + 1]] for s in range(plan.num_steps)]


@st.composite
def packing_inputs(draw):
    n = draw(st.integers(1, 400))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    lengths = rng.integers(1, draw(st.integers(2, 300)), n)
    row_tokens = int(lengths.max()) + draw(st.integers(0, 400))
    rows_per_step = draw(st.sampled_from([1, 2, 4, 6, 8, 16, 64]))
    divisors = [w for w in range(1, 65) if rows_per_step % w == 0]
    return dict(
        lengths=lengths,
        edges=draw(st.sampled_from([[0, 300], [0, 20, 100, 300]])),
        spec=PackingSpec(
            row_tokens=max(row_tokens, 300),
            rows_per_step=rows_per_step,
            attention_width=draw(st.integers(1, 4096)),
            open_rows=draw(st.integers(1, 20)),
            balance_rows=draw(st.integers(1, 100)),
            longest_first=draw(st.booleans()),
        ),
        seed=draw(st.integers(0, 2**31)),
        epoch=draw(st.integers(0, 50)),
        world_size=draw(st.sampled_from(divisors)),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(packing_inputs())
def test_every_sample_exactly_once_whole_and_rows_within_row_tokens(inp):
    plan = pack_epoch(
        inp["lengths"],
        inp["edges"],
        seed=inp["seed"],
        epoch=inp["epoch"],
        world_size=inp["world_size"],
        spec=inp["spec"],
    )
    assert np.array_equal(np.sort(plan.sample_ids), np.arange(inp["lengths"].size))
    assert np.array_equal(plan.lengths, inp["lengths"][plan.sample_ids])  # never split
    assert np.add.reduceat(plan.lengths, plan.rows.row_offsets[:-1]).max() <= inp["spec"].row_tokens
    assert (np.diff(plan.rows.row_offsets) >= 1).all()  # no empty row
    per_step = np.diff(plan.rows.step_rows)
    R = inp["spec"].rows_per_step
    assert (per_step[per_step != R] < R).all() and (per_step != R).sum() <= 1  # one tail step
    # Every rank has one micro-batch per step, and together they are the step's samples.
    mo = plan.micro_offsets
    assert mo.shape == (plan.num_steps, inp["world_size"] + 1)
    assert (np.diff(mo, axis=1) >= 0).all()
    assert np.array_equal(mo[:, 0], plan.rows.row_offsets[plan.rows.step_rows[:-1]])
    assert np.array_equal(mo[:, -1], plan.rows.row_offsets[plan.rows.step_rows[1:]])


@pytest.mark.parametrize("edges", [[0, 8192], TEAM_EDGES])
def test_contract4_every_sample_once_over_world_sizes_1_to_64(edges):
    spec = _spec()
    plans = {
        w: pack_epoch(LENGTHS, edges, seed=1, epoch=2, world_size=w, spec=spec)
        for w in (1, 2, 4, 8, 16, 32, 64)
    }
    ref = plans[1]
    for w, plan in plans.items():
        assert plan.content_hash == ref.content_hash  # contract 8: global steps ignore W
        assert np.array_equal(plan.sample_ids, ref.sample_ids)
        seen = np.concatenate([np.concatenate(_rank_samples(plan, r)) for r in range(w)])
        assert np.array_equal(np.sort(seen), np.arange(LENGTHS.size))
        rows = np.diff(plan.micro_rows, axis=1)
        full = np.diff(plan.rows.step_rows) == spec.rows_per_step
        assert (rows[full] == spec.rows_per_step // w).all()  # equal shares of a full step


def test_contract6_same_seed_and_epoch_same_packing_other_epochs_differ():
    spec = _spec()
    a = pack_epoch(LENGTHS, [0, 8192], seed=5, epoch=1, world_size=4, spec=spec)
    b = pack_epoch(LENGTHS, [0, 8192], seed=5, epoch=1, world_size=4, spec=spec)
    assert a.content_hash == b.content_hash
    assert np.array_equal(a.sample_ids, b.sample_ids)
    assert np.array_equal(a.rows.row_offsets, b.rows.row_offsets)
    for other in (dict(seed=5, epoch=2), dict(seed=6, epoch=1)):
        c = pack_epoch(LENGTHS, [0, 8192], world_size=4, spec=spec, **other)
        assert c.content_hash != a.content_hash
        assert not np.array_equal(c.sample_ids, a.sample_ids)


def test_the_hash_covers_the_packing_spec():
    a = pack_epoch(LENGTHS, [0, 8192], seed=0, epoch=0, world_size=1, spec=_spec())
    b = pack_epoch(LENGTHS, [0, 8192], seed=0, epoch=0, world_size=1, spec=_spec(open_rows=4))
    assert a.content_hash != b.content_hash


def test_contract1_one_row_open_is_the_seeded_shuffle_cut_in_order():
    """With one open row, rows are the (seed, epoch, bucket) permutation cut where the next
    sample does not fit: packing keeps the shuffle's order, it does not reorder samples."""
    lengths = np.random.default_rng(0).integers(1, 100, 500)
    spec = PackingSpec(row_tokens=300, rows_per_step=1, attention_width=64, open_rows=1)
    plan = pack_epoch(lengths, [0, 100], seed=7, epoch=3, world_size=1, spec=spec)
    stream = np.random.default_rng((7, 3, 0)).permutation(500)
    rows, cur, used = [], [], 0
    for i in stream:
        if used + lengths[i] > spec.row_tokens:
            rows.append(tuple(cur))
            cur, used = [], 0
        cur.append(int(i))
        used += lengths[i]
    rows.append(tuple(cur))
    got = {
        tuple(plan.sample_ids[a:b])
        for a, b in zip(plan.rows.row_offsets[:-1], plan.rows.row_offsets[1:], strict=True)
    }
    assert got == set(rows)


def test_bucketed_rows_hold_one_bucket_each():
    plan = pack_epoch(LENGTHS, TEAM_EDGES, seed=0, epoch=0, world_size=8, spec=_spec())
    b = np.searchsorted(TEAM_EDGES, plan.lengths, side="left") - 1
    row = np.repeat(np.arange(plan.rows.num_rows), np.diff(plan.rows.row_offsets))
    assert np.array_equal(b, plan.rows.row_bucket[row])
    assert np.unique(plan.rows.row_bucket).size == len(TEAM_EDGES) - 1


def test_best_fit_takes_the_tightest_open_row_and_closes_the_fullest():
    # rows of 10, two open: 6 -> r0 (room 4); 5 -> r1 (room 5); 4 -> r0 (exact fit: closes);
    # 3 -> r1 (room 2); 9 -> r2 (room 1); 8 fits neither: r2 (the fullest) closes for r3;
    # the end closes r1 and r3, oldest first.
    row_of, closed = best_fit_rows([6, 5, 4, 3, 9, 8], 10, 2, min_len=1)
    assert row_of.tolist() == [0, 1, 0, 1, 2, 3]
    assert closed.tolist() == [0, 2, 1, 3]


def test_bounded_best_fit_fills_rows_of_the_902k_lengths():
    plan = pack_epoch(
        LENGTHS, [0, 8192], seed=0, epoch=0, world_size=8, spec=_spec(rows_per_step=8)
    )
    assert packed_summary(plan)["row_fill"] >= 0.98


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_ranks_of_a_step_carry_nearly_the_same_cost(world_size):
    spec = _spec(rows_per_step=8, attention_width=6 * 2048)
    plan = pack_epoch(LENGTHS, [0, 8192], seed=0, epoch=0, world_size=world_size, spec=spec)
    costs = rank_costs(plan)
    full = np.diff(plan.rows.step_rows) == spec.rows_per_step
    ratio = costs[full].max(axis=1).sum() / costs[full].mean(axis=1).sum()
    assert ratio <= 1.01
    assert packed_summary(plan)["useful_over_paid"] >= 0.98


def test_balancing_leaves_no_trend_of_cost_or_length_within_an_epoch():
    spec = _spec(rows_per_step=8, attention_width=6 * 2048, balance_rows=64)
    for seed in range(3):
        plan = pack_epoch(LENGTHS, [0, 8192], seed=seed, epoch=0, world_size=8, spec=spec)
        step_cost = np.add.reduceat(row_costs(plan), plan.rows.step_rows[:-1])
        step_len = np.add.reduceat(plan.lengths**2, plan.rows.row_offsets[plan.rows.step_rows[:-1]])
        idx = np.arange(plan.num_steps)
        bound = 4 / np.sqrt(plan.num_steps)  # 4 standard errors of a null correlation
        for series in (step_cost, step_len):
            assert abs(np.corrcoef(idx, series)[0, 1]) < bound
            # Nor a trend inside the balancing windows (sorting made each window heavy-first).
            assert abs(np.corrcoef(idx % spec.window_steps, series)[0, 1]) < bound


def test_longest_first_puts_the_costliest_step_first():
    plan = pack_epoch(
        LENGTHS, [0, 8192], seed=0, epoch=0, world_size=1, spec=_spec(rows_per_step=8)
    )
    step_cost = np.add.reduceat(row_costs(plan), plan.rows.step_rows[:-1])
    assert step_cost[0] == step_cost.max()


def test_contract7_a_slice_is_the_tail_of_the_epoch():
    plan = pack_epoch(
        LENGTHS, [0, 8192], seed=0, epoch=0, world_size=4, spec=_spec(rows_per_step=8)
    )
    for s in (0, 1, 17, plan.num_steps - 1, plan.num_steps):
        tail = plan.slice(s)
        assert tail.first_step == s and tail.num_steps == plan.num_steps - s
        assert tail.content_hash == plan.content_hash
        assert np.array_equal(
            tail.sample_ids, plan.sample_ids[plan.rows.row_offsets[plan.rows.step_rows[s]] :]
        )
        base = plan.rows.row_offsets[plan.rows.step_rows[s]]
        assert np.array_equal(tail.micro_offsets + base, plan.micro_offsets[s:])


def test_a_world_size_that_does_not_divide_rows_per_step_is_refused_naming_the_fix():
    with pytest.raises(
        ConfigError, match=r"rows_per_step=12 .* world size 8.*multiple of 8 \(e\.g\. 16\)"
    ):
        check_world_size(12, 8)
    with pytest.raises(ConfigError, match="rows_per_step"):
        pack_epoch(LENGTHS, [0, 8192], seed=0, epoch=0, world_size=3, spec=_spec(rows_per_step=8))
    plan = pack_epoch(
        LENGTHS, [0, 8192], seed=0, epoch=0, world_size=2, spec=_spec(rows_per_step=8)
    )
    with pytest.raises(ConfigError, match="rows_per_step"):
        plan.with_world_size(5)
    assert plan.with_world_size(8).content_hash == plan.content_hash


def test_rows_shorter_than_the_top_edge_or_a_sample_are_refused():
    with pytest.raises(ConfigError, match=r"row_tokens=4096 is below the top bucket edge 8192"):
        pack_epoch(LENGTHS, [0, 8192], seed=0, epoch=0, world_size=1, spec=_spec(row_tokens=4096))
    with pytest.raises(ConfigError, match="raise row_tokens to at least 20"):
        best_fit_rows([3, 20], 10, 4)


def test_the_cost_model_is_tokens_plus_squares_over_the_width():
    assert doc_cost(np.array([100, 2048]), 2048).tolist() == [100 + 100 * 100 / 2048, 2048 + 2048]
    plan = pack_epoch(LENGTHS[:300], [0, 8192], seed=0, epoch=0, world_size=1, spec=_spec())
    L = plan.lengths.astype(float)
    r0 = slice(plan.rows.row_offsets[0], plan.rows.row_offsets[1])
    assert row_costs(plan)[0] == pytest.approx(8192 + (L[r0] ** 2).sum() / (6 * 256))
