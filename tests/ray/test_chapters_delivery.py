"""Chapters at delivery: the feeder prepares an epoch chapter by chapter, and every rank still
trains exactly the unchaptered sequence (same plan hash), from the start or from a resume inside
a chapter; chapters every rank has passed are dropped, so about two are held at once."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest
import ray

from pipeline.core.chapters import chapter_end, chapters_from, step_tokens
from pipeline.core.ranges import chapter_bounds_for, lead_in_bounds
from pipeline.data import (
    build_length_index,
    epoch_plan_for,
    rank_batches,
    resolve_edges,
    start_feeder,
    stop_feeder,
)
from tests.ray.small_corpus import base_cfg, feeder_streams, write_corpus

pytestmark = pytest.mark.ray

CHAPTER_STEPS = 9
LEAD = 40  # tokens: about one step of this corpus
TENSORS = ("input_ids", "attention_mask", "labels", "position_ids")


class Data:
    def __init__(self, path):
        self.path = str(path)
        lengths = np.random.default_rng(5).integers(1, 65, 600)
        self.tokens = write_corpus(self.path, lengths, shards=3, rows_per_group=50)
        self.cfg = base_cfg(
            self.path, train={"epochs": 2}, delivery={"chapter_steps": CHAPTER_STEPS}
        )
        self.whole_cfg = base_cfg(self.path, train={"epochs": 2}, delivery={"chapter_tokens": None})
        # a lead-in of at most LEAD tokens, then 4x, ... up to the chapter's end
        self.lead_cfg = base_cfg(
            self.path,
            train={"epochs": 2},
            delivery={"chapter_steps": CHAPTER_STEPS, "lead_tokens": LEAD},
        )
        self.index = build_length_index(self.cfg)
        self.edges = resolve_edges(self.cfg, self.index.lengths)

    def feeder(self, cfg, prefetch=False) -> str:
        name = f"chapters-{uuid.uuid4().hex[:8]}"
        start_feeder(cfg, self.index, self.edges, name=name, path=self.path, prefetch=prefetch)
        return name

    def plan(self, epoch, world):
        return epoch_plan_for(self.cfg, self.index, self.edges, epoch, world)

    def bounds(self, plan):
        return chapter_bounds_for(plan, self.cfg.delivery)

    def streams(self, cfg, world, epoch=0, start_step=0):
        h = self.plan(epoch, world).content_hash  # a part of another plan would be refused
        return feeder_streams(
            cfg, self.index, self.edges, self.path, world, h, epoch=epoch, start_step=start_step
        )


@pytest.fixture(scope="module")
def data(cluster, tmp_path_factory):
    return Data(tmp_path_factory.mktemp("chapters"))


def assert_same_streams(got, want):
    for r, (g, w) in enumerate(zip(got, want, strict=True)):
        assert [mb.step for mb in g] == [mb.step for mb in w], r
        for a, b in zip(g, w, strict=True):
            assert a.bucket == b.bucket and np.array_equal(a.sample_ids, b.sample_ids)
            assert all((getattr(a, k) == getattr(b, k)).all() for k in TENSORS), (r, a.step)


@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_chaptered_epoch_delivers_the_unchaptered_per_rank_sequence(data, world):
    plan = data.plan(0, world)
    bounds = data.bounds(plan)
    assert bounds.size - 1 >= 4, "the corpus is sized to give several chapters"
    whole, whole_status = data.streams(data.whole_cfg, world)
    chaptered, status = data.streams(data.cfg, world)
    assert_same_streams(chaptered, whole)
    for r, stream in enumerate(chaptered):  # and both are the plan's view
        ids = np.concatenate([mb.sample_ids for mb in stream])
        assert np.array_equal(ids, plan.rank_view(r).sample_ids)
    assert [s["chapters"] for s in whole_status] == [1]
    # Each chapter was read, keyed, sorted and split on its own, under the epoch's plan hash.
    assert [(s["start_step"], s["end_step"]) for s in status] == list(
        zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)
    )
    assert {s["plan_hash"] for s in status} == {plan.content_hash}
    assert sum(s["rows_sorted"] for s in status) == plan.num_samples


def test_resume_inside_a_chapter_delivers_the_unchaptered_tail(data):
    bounds = data.bounds(data.plan(0, 2))
    start = int(bounds[1]) + 3  # inside the second chapter
    whole, _ = data.streams(data.whole_cfg, 2, start_step=start)
    chaptered, status = data.streams(data.cfg, 2, start_step=start)
    assert_same_streams(chaptered, whole)
    assert chaptered[0][0].step == start
    first = status[0]
    assert (first["chapter"], first["start_step"], first["end_step"]) == (1, start, bounds[2])
    assert sum(s["rows_sorted"] for s in status) == sum(
        mb.sample_ids.size for s in chaptered for mb in s
    )


def _held(name):
    return ray.get(ray.get_actor(name).memory.remote())


def test_chapters_are_prepared_ahead_and_dropped_once_every_rank_passed_them(data):
    world = 2
    nxt = int(data.bounds(data.plan(1, world))[1])
    name = data.feeder(data.cfg, prefetch=True)
    try:
        gens = [
            rank_batches(name, epoch=0, start_step=0, rank=r, world_size=world)
            for r in range(world)
        ]
        held_counts = []
        for mbs in zip(*gens, strict=True):  # the ranks in step, as DDP keeps them
            held_counts.append(len(_held(name)["held"]))
            assert len({mb.step for mb in mbs}) == 1
        for g in gens:
            assert next(g, None) is None
        assert max(held_counts) <= 2, held_counts  # the chapter in use and the next one
        # After the epoch only the next epoch's first chapter (prefetched) is held.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = _held(name)
            if [tuple(k) for k in m["held"]] == [(1, world, 0, nxt)]:
                break
            time.sleep(0.2)
        # (epoch, world, start, end): the whole chapter, not a lead-in, as it was prefetched
        assert [tuple(k) for k in m["held"]] == [(1, world, 0, nxt)], m
        stats = ray.get(ray.get_actor(name).history.remote())
        chapter_bytes = max(s["bytes"] for s in stats)
        assert 0 < m["peak_held_bytes"] <= 2 * chapter_bytes * 1.5
    finally:
        stop_feeder(name)


@pytest.mark.parametrize(
    "start", [0, pytest.param(CHAPTER_STEPS + 4, marks=pytest.mark.slow)]
)  # a cold start; a resume mid-chapter
def test_a_lead_in_then_chapters_deliver_the_unchaptered_sequence(data, start):
    world = 2
    plan = data.plan(0, world)
    bounds = data.bounds(plan)
    whole, _ = data.streams(data.whole_cfg, world, start_step=start)
    led, status = data.streams(data.lead_cfg, world, start_step=start)
    assert_same_streams(led, whole)
    assert led[0][0].step == start
    # small ranges first, growing fourfold up to the chapter's end, then the regular chapters
    cuts = lead_in_bounds(step_tokens(plan), bounds, start, LEAD)
    assert cuts.size > 3, "the corpus is sized for a lead-in of several ranges"
    want = list(zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True))
    want += [(c.first_step, c.end_step) for c in chapters_from(bounds, int(cuts[-1]))]
    assert [(s["start_step"], s["end_step"]) for s in status] == want
    assert {s["plan_hash"] for s in status} == {plan.content_hash}
    # every range is prepared in the feeder; a lead-in's ranges (ending before their chapter)
    # read just their rows, a chapter reads whole row groups into the row cache (or finds them
    # there)
    lead_in = [e < chapter_end(bounds, a) for a, e in want]
    assert any(lead_in) and all(s["in_feeder"] for s in status)
    for s, small in zip(status, lead_in, strict=True):
        assert s["rg_filled"] == 0 if small else s["rg_parquet"] == 0, s


@pytest.mark.slow
def test_without_the_row_cache_chapters_are_sorted_by_ray_data_after_the_lead_in(data):
    world = 2
    plan = data.plan(0, world)
    cfg = data.lead_cfg.model_copy(deep=True)
    cfg.delivery.row_cache = False
    led, status = data.streams(cfg, world)
    whole, _ = data.streams(data.whole_cfg, world)
    assert_same_streams(led, whole)
    # the lead-in's ranges are read in the feeder, chapters by a Ray Data pass; all from parquet
    lead_in = [s["end_step"] < chapter_end(data.bounds(plan), s["start_step"]) for s in status]
    assert [s["in_feeder"] for s in status] == lead_in and any(lead_in) and not all(lead_in)
    assert all(s["rg_parquet"] == s["row_groups_read"] for s in status)


def test_a_range_started_ahead_is_the_one_the_ranks_ask_for(data):
    """The driver's start_at (made while the workers start) prepares the lead-in's first range:
    the ranks' first request finds it, and the sequence is the unchaptered one."""
    world, start = 2, CHAPTER_STEPS + 4
    plan = data.plan(0, world)
    cuts = lead_in_bounds(step_tokens(plan), data.bounds(plan), start, LEAD)
    name = data.feeder(data.lead_cfg)
    try:
        assert ray.get(ray.get_actor(name).start_at.remote(0, world, start)) == cuts[1]
        got = [
            list(rank_batches(name, epoch=0, start_step=start, rank=r, world_size=world))
            for r in range(world)
        ]
        status = ray.get(ray.get_actor(name).history.remote())
    finally:
        stop_feeder(name)
    assert [(s["start_step"], s["end_step"]) for s in status[:2]] == [
        (start, cuts[1]),
        (cuts[1], cuts[2]),
    ]  # prepared once, first, for both ranks
    for r, stream in enumerate(got):
        ids = np.concatenate([mb.sample_ids for mb in stream])
        assert np.array_equal(ids, plan.slice(start).rank_view(r).sample_ids)


def test_ranks_restarted_inside_a_held_chapter_skip_to_their_step_without_a_new_read(data):
    """Ray Train restarts the workers from a checkpoint while the driver's feeder lives: the
    chapter they were training is still held, so they skip to the checkpoint's step in its
    blocks (no lead-in, no read) and train exactly the undisturbed sequence from there."""
    world = 2
    plan = data.plan(0, world)
    bounds = data.bounds(plan)
    ckpt = int(bounds[1]) + 3  # inside the second chapter
    name = data.feeder(data.cfg)
    feeder = ray.get_actor(name)
    try:
        gens = [
            rank_batches(name, epoch=0, start_step=0, rank=r, world_size=world)
            for r in range(world)
        ]
        for mbs in zip(*gens, strict=True):  # in step, past the checkpoint, then lost
            if mbs[0].step == ckpt + 2:
                break
        for g in gens:
            g.close()
        before = ray.get(feeder.history.remote())
        again = [
            list(
                rank_batches(
                    name,
                    epoch=0,
                    start_step=ckpt,
                    rank=r,
                    world_size=world,
                    plan_hash=plan.content_hash,
                )
            )
            for r in range(world)
        ]
        after = ray.get(feeder.history.remote())
    finally:
        stop_feeder(name)
    whole, _ = data.streams(data.whole_cfg, world, start_step=ckpt)
    assert_same_streams(again, whole)
    assert again[0][0].step == ckpt
    # served from the chapter held: nothing prepared from the checkpoint's step; the chapters
    # after it were prepared as usual
    assert (1, int(bounds[1]), int(bounds[2])) in [
        (s["chapter"], s["start_step"], s["end_step"]) for s in before
    ]
    new = after[len(before) :]
    assert [s["start_step"] for s in new] == bounds[2:-1].tolist()
