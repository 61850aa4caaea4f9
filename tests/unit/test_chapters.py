"""Chapters change when rows are prepared, never what a rank trains: invariants over plan grids."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core.chapters import (
    Chapter,
    chapter_bounds,
    chapter_of,
    chapter_plan,
    chapter_read_bytes,
    chapters_from,
    plan_chapter_bounds,
    row_group_of,
    step_tokens,
)
from pipeline.core.config import TEAM_EDGES, BatchingConfig, DeliveryConfig
from pipeline.core.deliveryconfig import DEFAULT_CHAPTER_TOKENS
from pipeline.core.plan import epoch_plan
from pipeline.core.ranges import lead_in_bounds
from pipeline.core.synthetic import seed902k_lengths
from tests.unit.test_plan_contracts import _plan, planning_inputs

GRID = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
caps = st.tuples(
    st.one_of(st.none(), st.integers(1, 12)), st.one_of(st.none(), st.integers(1, 6000))
)


def _concat_views(plans, rank):
    views = [p.rank_view(rank) for p in plans]
    sizes = np.concatenate([np.diff(v.offsets) for v in views])
    return {
        "steps": np.concatenate([v.steps for v in views]),
        "buckets": np.concatenate([v.buckets for v in views]),
        "offsets": np.concatenate([[0], np.cumsum(sizes)]),
        "sample_ids": np.concatenate([v.sample_ids for v in views]),
        "lengths": np.concatenate([v.lengths for v in views]),
    }


def _assert_same_stream(plans, whole):
    for p in plans:
        assert p.content_hash == whole.content_hash
    for r in range(whole.world_size):
        got, want = _concat_views(plans, r), whole.rank_view(r)
        for k, v in got.items():
            assert np.array_equal(v, getattr(want, k)), (r, k)


@GRID
@given(planning_inputs(), caps)
def test_chapters_delivered_in_turn_are_the_epoch_rank_views(inp, cap):
    p = _plan(inp)
    max_steps, max_tokens = cap
    b = plan_chapter_bounds(p, max_steps=max_steps, max_tokens=max_tokens)
    assert b[0] == 0 and b[-1] == p.num_steps and (p.num_steps == 0 or (np.diff(b) > 0).all())
    tok = np.add.reduceat(step_tokens(p), b[:-1]) if p.num_steps else np.zeros(0)
    if max_steps is not None:
        assert (np.diff(b) <= max_steps).all()
    if max_tokens is not None:
        assert ((tok <= max_tokens) | (np.diff(b) == 1)).all()
    chapters = [chapter_plan(p, int(a), int(e)) for a, e in zip(b[:-1], b[1:], strict=True)]
    _assert_same_stream(chapters, p)
    for c in chapters:  # each chapter is keyed and split on its own
        keys, rank_rows = c.sort_keys()
        assert np.array_equal(np.sort(keys), np.arange(c.num_samples))
        assert rank_rows.sum() == c.num_samples


@GRID
@given(planning_inputs(), caps, st.data())
def test_resume_starts_in_the_chapter_holding_the_step_from_that_step(inp, cap, data):
    p = _plan(inp)
    b = plan_chapter_bounds(p, max_steps=cap[0], max_tokens=cap[1])
    s = data.draw(st.integers(0, p.num_steps))
    todo = chapters_from(b, s)
    if s == p.num_steps:
        assert todo == []
        return
    assert todo[0].index == chapter_of(b, s) and todo[0].first_step == s
    assert b[todo[0].index] <= s < b[todo[0].index + 1] == todo[0].end_step
    assert [c.index for c in todo] == list(range(todo[0].index, b.size - 1))
    plans = [chapter_plan(p, c.first_step, c.end_step) for c in todo]
    _assert_same_stream(plans, p.slice(s))


@GRID
@given(planning_inputs(), caps, st.integers(1, 3000), st.data())
def test_a_lead_in_then_the_chapters_deliver_the_epoch_tail(inp, cap, lead, data):
    p = _plan(inp)
    if p.num_steps == 0:
        return
    b = plan_chapter_bounds(p, max_steps=cap[0], max_tokens=cap[1])
    s = data.draw(st.integers(0, p.num_steps - 1))  # a cold start or a resume, anywhere
    cuts = lead_in_bounds(step_tokens(p), b, s, lead)
    c = chapter_of(b, s)
    assert cuts[0] == s and cuts[-1] == b[c + 1] and (np.diff(cuts) > 0).all()
    cum = np.concatenate([[0], np.cumsum(step_tokens(p))])
    tok = np.diff(cum[cuts])
    # each range at most lead * 4**i tokens, or a single step
    assert ((tok <= lead * 4 ** np.arange(tok.size)) | (np.diff(cuts) == 1)).all()
    ranges = list(zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True))
    ranges += [(ch.first_step, ch.end_step) for ch in chapters_from(b, int(cuts[-1]))]
    _assert_same_stream([chapter_plan(p, a, e) for a, e in ranges], p.slice(s))


def test_balanced_cut_uses_the_fewest_chapters_of_equal_size():
    b = chapter_bounds(np.full(100, 10), max_tokens=250)
    assert b.tolist() == [0, 25, 50, 75, 100]  # ceil(1000 / 250) chapters of 250 tokens
    assert chapter_bounds(np.full(10, 1), max_steps=4).tolist() == [0, 3, 7, 10]  # not 4, 4, 2
    # a token limit that needs fewer chapters than the step limit leaves the steps balanced
    tok = np.array([1] * 9 + [50])
    assert chapter_bounds(tok, max_steps=5, max_tokens=1000).tolist() == [0, 5, 10]
    assert chapter_bounds(tok, max_steps=5, max_tokens=30).tolist() == [0, 5, 9, 10]
    assert chapter_bounds(np.full(5, 1), first_step=7).tolist() == [7, 12]  # no limit: one


def test_a_step_over_the_token_limit_is_a_chapter_of_its_own():
    assert chapter_bounds(np.array([10, 100, 10]), max_tokens=50).tolist() == [0, 1, 2, 3]
    b = chapter_bounds(np.array([1, 1, 1, 1, 40, 1, 1, 1, 1, 1]), max_tokens=41, max_steps=6)
    assert b.tolist() == [0, 4, 5, 10]  # balanced on tokens, the big step apart
    # token-balanced cuts crowd around one heavy step and break the step limit: greedy fallback
    b = chapter_bounds(np.array([1000] + [1] * 60), max_tokens=1000, max_steps=3)
    assert b.tolist() == [0, 1, *range(4, 62, 3)]  # the fewest chapters: 1 + 60 / 3


def test_limits_and_steps_outside_the_epoch_are_refused():
    with pytest.raises(ValueError, match="max_steps must be >= 1"):
        chapter_bounds(np.ones(3), max_steps=0)
    with pytest.raises(ValueError, match=r"step 5 outside the chapters' steps \[0, 5\)"):
        chapter_of(np.array([0, 2, 5]), 5)
    assert chapters_from(np.array([0, 2, 5]), 1) == [Chapter(0, 1, 2), Chapter(1, 2, 5)]


def test_default_chapters_of_the_902k_preset_fit_and_ignore_world_size():
    default = DeliveryConfig.model_fields["chapter_tokens"].default
    assert default == DEFAULT_CHAPTER_TOKENS == 2**28
    lengths = seed902k_lengths()
    batching = BatchingConfig(token_budget=262_144, round_to=8, pad_to_multiple_of=64)
    bounds = {}
    for w in (1, 8, 64):
        p = epoch_plan(lengths, TEAM_EDGES, epoch=0, world_size=w, batching=batching)
        b = plan_chapter_bounds(p, max_tokens=DEFAULT_CHAPTER_TOKENS)
        assert (np.add.reduceat(step_tokens(p), b[:-1]) <= DEFAULT_CHAPTER_TOKENS).all()
        bounds[w] = b.tolist()
    assert bounds[1] == bounds[8] == bounds[64] and len(bounds[1]) == 5  # 1.06B tokens: 4


def test_row_group_of_matches_the_files_row_group_layout():
    groups = ((3, 3, 1), (), (2, 5))
    fidx = np.array([0, 0, 0, 0, 2, 2, 2, 0])
    rows = np.array([0, 2, 3, 6, 0, 1, 6, 5])
    # file 0: rows 0-2 rg 0, 3-5 rg 1, 6 rg 2; file 1 has none; file 2: rows 0-1 rg 3, 2-6 rg 4
    assert row_group_of(fidx, rows, groups).tolist() == [0, 0, 1, 2, 3, 3, 4, 1]


@settings(max_examples=60, deadline=None)
@given(planning_inputs(), st.integers(1, 8), st.integers(1, 40))
def test_read_estimate_counts_each_row_group_once_per_chapter_touching_it(inp, steps, rg_rows):
    p = _plan(inp)
    n = len(inp["lengths"])
    rg = np.arange(n) // rg_rows  # one file, rows in sample-id order
    rg_bytes = np.bincount(rg, weights=4.0 * np.asarray(inp["lengths"]))
    b = plan_chapter_bounds(p, max_steps=steps)
    got = chapter_read_bytes(p, b, rg[p.sample_ids], rg_bytes)
    for i, (a, e) in enumerate(zip(b[:-1], b[1:], strict=True)):
        ids = chapter_plan(p, int(a), int(e)).sample_ids
        touched = set(rg[ids].tolist())
        assert got["touched"][i] == len(touched)
        assert got["bytes"][i] == pytest.approx(sum(rg_bytes[u] for u in touched))
    assert got["epoch_bytes"] == pytest.approx(sum(got["bytes"]))
    whole = chapter_read_bytes(p, b[[0, -1]], rg[p.sample_ids], rg_bytes)
    assert whole["epoch_bytes"] <= got["epoch_bytes"] + 1e-6
