"""Which range each request is served (`pipeline.core.ranges`): chapter bounds from the config,
lead-ins at a cold start or a resume, each range's end decided once for every rank, positions.

Pure: the feeder and the first-step benchmark make these decisions through this module only, so
what the benchmark predicts is what the feeder serves.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from pipeline.core.chapters import plan_chapter_bounds, step_tokens
from pipeline.core.config import BatchingConfig, DeliveryConfig, PlanConfig
from pipeline.core.plan import epoch_plan
from pipeline.core.ranges import (
    EpochRanges,
    RangeBook,
    RangeDecisions,
    RankPositions,
    chapter_bounds_for,
    lead_in_bounds,
)

EDGES = [0, 64, 128, 256]
BATCHING = BatchingConfig(token_budget=2048, round_to=8, pad_to_multiple_of=8)


def _plan(epoch: int = 0, world: int = 2):
    lengths = np.random.default_rng(7).integers(8, 256, 600)
    return epoch_plan(
        lengths, EDGES, epoch=epoch, world_size=world, batching=BATCHING, plan=PlanConfig(seed=1)
    )


def _delivery(**kw) -> DeliveryConfig:
    return DeliveryConfig.model_validate(kw)


class _Planner:
    """plan_for that counts how often each (epoch, world size) was planned."""

    def __init__(self):
        self.calls: list[tuple[int, int]] = []

    def __call__(self, epoch: int, world: int):
        self.calls.append((epoch, world))
        return _plan(epoch, world)


def test_chapter_bounds_follow_the_config_limits():
    p = _plan()
    delivery = _delivery(chapter_steps=7, chapter_tokens=20_000, lead_tokens=None)
    b = chapter_bounds_for(p, delivery)
    assert b.tolist() == plan_chapter_bounds(p, max_steps=7, max_tokens=20_000).tolist()
    assert b.size > 2 and (np.diff(b) <= 7).all()
    assert chapter_bounds_for(p, _delivery(chapter_steps=None, chapter_tokens=None)).tolist() == [
        0,
        p.num_steps,
    ]


def test_epoch_ranges_name_the_chapter_and_tell_a_lead_in_range():
    p = _plan()
    er = EpochRanges.of(p, _delivery(chapter_steps=10, chapter_tokens=None))
    assert er.bounds.tolist() == chapter_bounds_for(p, _delivery(chapter_steps=10)).tolist()
    assert er.num_steps == p.num_steps and er.num_chapters == er.bounds.size - 1
    end0 = int(er.bounds[1])
    assert er.chapter_end(0) == end0 and er.chapter_of(end0) == 1
    assert er.chapter_of(p.num_steps) == -1  # the epoch's end: no chapter
    assert er.is_lead_in(0, end0 - 1) and not er.is_lead_in(0, end0)
    assert not er.is_lead_in(p.num_steps, p.num_steps)
    cuts = er.lead_in(3, 500)
    assert cuts.tolist() == lead_in_bounds(step_tokens(p), er.bounds, 3, 500).tolist()


def test_a_cold_start_leads_in_and_the_later_cuts_are_decided_with_it():
    delivery = _delivery(chapter_steps=40, chapter_tokens=None, lead_tokens=500)
    dec = RangeDecisions(_Planner(), delivery)
    er = dec.epoch(0, 2)
    cuts = er.lead_in(0, 500).tolist()
    assert len(cuts) > 2  # a lead-in of several ranges up to the chapter's end
    assert dec.end_for(0, 2, 0, None, may_lead=True) == cuts[1]
    # every rank asks the same start: the same end, whoever asks first and how
    assert dec.end_for(0, 2, 0, None, may_lead=False) == cuts[1]
    # the next request continues the stream: the lead-in's next cut, no new lead-in
    for a, e in zip(cuts[1:-1], cuts[2:], strict=True):
        assert dec.decided(0, 2, a)
        assert dec.end_for(0, 2, a, None, may_lead=True) == e
    # at the chapter's end the stream continues into a whole chapter
    nxt = cuts[-1]
    assert dec.end_for(0, 2, nxt, None, may_lead=True) == er.chapter_end(nxt)


def test_a_resume_leads_in_but_a_prefetch_or_a_given_end_does_not():
    delivery = _delivery(chapter_steps=40, chapter_tokens=None, lead_tokens=500)
    dec = RangeDecisions(_Planner(), delivery)
    er = dec.epoch(0, 2)
    s = 13  # mid-chapter, nothing decided: a resume
    assert dec.end_for(0, 2, s, None, may_lead=True) == er.lead_in(s, 500)[1]
    fresh = RangeDecisions(_Planner(), delivery)
    assert fresh.end_for(0, 2, s, None, may_lead=False) == er.chapter_end(s)  # prefetch
    kept = RangeDecisions(_Planner(), delivery)
    assert kept.end_for(0, 2, s, s + 2, may_lead=True) == s + 2  # a worker asking again
    assert kept.end_for(0, 2, s, None, may_lead=True) == s + 2
    # the epoch's end serves nothing
    assert kept.end_for(0, 2, er.num_steps, None, may_lead=True) == er.num_steps


def test_without_lead_tokens_every_range_is_a_chapter():
    dec = RangeDecisions(_Planner(), _delivery(chapter_steps=40, lead_tokens=None))
    er = dec.epoch(0, 1)
    assert dec.end_for(0, 1, 5, None, may_lead=True) == er.chapter_end(5)


def test_two_epochs_are_remembered_and_an_older_ones_decisions_forgotten():
    planner = _Planner()
    dec = RangeDecisions(planner, _delivery(chapter_steps=40, lead_tokens=500))
    end = dec.end_for(0, 2, 0, None, may_lead=True)
    dec.epoch(0, 2)
    dec.epoch(1, 2)
    assert planner.calls == [(0, 2), (1, 2)] and dec.decided(0, 2, 0)
    dec.epoch(2, 2)  # epoch 0 is dropped, with its decided ranges
    assert not dec.decided(0, 2, 0)
    assert dec.end_for(0, 2, 0, None, may_lead=True) == end  # planned again, decided alike
    assert planner.calls == [(0, 2), (1, 2), (2, 2), (0, 2)]


def test_concurrent_requests_plan_an_epoch_once_and_agree_on_its_end():
    planner = _Planner()
    dec = RangeDecisions(planner, _delivery(chapter_steps=40, lead_tokens=500))
    ends: list[int] = []
    threads = [
        threading.Thread(target=lambda: ends.append(dec.end_for(0, 4, 0, None, may_lead=True)))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert planner.calls == [(0, 4)] and len(set(ends)) == 1 and len(ends) == 8


def test_a_lead_in_grows_fourfold_up_to_the_chapter_end():
    b = np.array([0, 100, 200])
    assert lead_in_bounds(np.full(200, 10), b, 0, 20).tolist() == [0, 2, 10, 42, 100]
    # from a resume in the second chapter; a step larger than the lead is a range of its own
    assert lead_in_bounds(np.full(200, 10), b, 150, 5).tolist() == [150, 151, 153, 161, 193, 200]
    assert lead_in_bounds(np.full(200, 10), b, 0, 10**6).tolist() == [0, 100]
    with pytest.raises(ValueError, match="lead_tokens and growth must be >= 1"):
        lead_in_bounds(np.ones(3), np.array([0, 3]), 0, 0)


def test_a_chapter_is_needed_until_every_rank_of_the_world_has_passed_it():
    pos = RankPositions()
    pos.move(0, 2, 10, rank=0)
    assert not pos.passed(0, 5)  # rank 1 has not said where it is
    pos.move(0, 2, 4, rank=1)
    assert pos.passed(0, 4) and not pos.passed(0, 5)
    pos.move(1, 2, 0, rank=1)
    assert pos.passed(0, 10) and not pos.passed(0, 11)  # (epoch, step) order
    pos.move(1, 3, 0, rank=0)  # a resized world: nobody else has spoken yet
    assert not pos.passed(0, 0)


def test_range_ends_are_decided_once_and_a_decided_end_continues_the_stream():
    book = RangeBook()
    assert book.end(0, 2, 0) is None and not book.continues(0, 2, 0)  # cold: may lead in
    assert book.record(0, 2, [0, 3, 10, 40], epoch_steps=50) == 3
    assert [book.end(0, 2, s) for s in (0, 3, 10)] == [3, 10, 40]
    assert book.continues(0, 2, 40) and not book.continues(0, 2, 41)  # a resume at 41 leads in
    # a second decision from a decided start keeps the first (every rank gets the same end)
    assert book.record(0, 2, [3, 40], epoch_steps=50) == 10
    assert book.record(0, 2, [40, 50], epoch_steps=50) == 50
    assert book.continues(1, 2, 0) and not book.continues(1, 3, 0)  # next epoch, same world
    book.forget(0, 2)
    assert book.end(0, 2, 0) is None and not book.continues(0, 2, 40)
    assert book.continues(1, 2, 0)  # belongs to epoch 1
