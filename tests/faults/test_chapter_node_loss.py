"""Chapters and windows on a simulated three-node cluster (`ray.cluster_utils`): without the row
cache each range's Ray Data pass runs on the two worker nodes (and, with windows, the rows a
window carries into the next are held there). A node holding part of the range being trained
(and of the next, prepared ahead) is removed mid-range, and every rank still gets exactly its
planned sequence: lost blocks are rebuilt by Ray from their lineage, or, failing that, the stream
asks the feeder to prepare the range again, and a lost held part is read again from its row
groups."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import ray

from pipeline.core.chapters import plan_chapter_bounds
from pipeline.data import (
    build_length_index,
    epoch_plan_for,
    rank_batches,
    resolve_edges,
    start_feeder,
    stop_feeder,
)
from tests.faults.conftest import report
from tests.ray.conftest import three_node_cluster
from tests.ray.small_corpus import assert_exact_streams, base_cfg, write_corpus

pytestmark = [pytest.mark.ray, pytest.mark.slow]

WORLD = 2
# (delivery and plan fields, micro-batches into the second range the node is removed at)
CASES = {
    "chapters": ({"delivery": {"chapter_steps": 12, "row_cache": False}}, 4),
    # the defaults for windows: no row cache, no lead-in
    "windows": ({"plan": {"window_tokens": 5000}}, 2),
}


@pytest.fixture
def three_nodes():
    with three_node_cluster() as (cluster, nodes):
        yield cluster, nodes


@pytest.mark.parametrize("kind", list(CASES))
def test_node_lost_mid_range_keeps_every_rank_sequence_exact(three_nodes, tmp_path, kind):
    cluster, nodes = three_nodes
    sections, into = CASES[kind]
    path = tmp_path / "data"
    lengths = np.random.default_rng(3).integers(1, 65, 600)
    tokens = write_corpus(str(path), lengths, shards=3, rows_per_group=50)
    cfg = base_cfg(path, data={"cache_dir": str(tmp_path / "index")}, **sections)
    index = build_length_index(cfg)
    edges = resolve_edges(cfg, index.lengths)
    plan = epoch_plan_for(cfg, index, edges, 0, WORLD)
    if kind == "windows":
        assert not cfg.delivery_used.row_cache and cfg.delivery_used.lead_tokens is None
        bounds = plan.window_steps
    else:
        bounds = plan_chapter_bounds(plan, max_steps=12, max_tokens=cfg.delivery.chapter_tokens)
    assert bounds.size - 1 >= 3
    lose_at = int(bounds[1]) + into  # inside the second range, the third prepared ahead

    name = f"node-loss-{kind}-{uuid.uuid4().hex[:8]}"
    start_feeder(cfg, index, edges, name=name, path=str(path), prefetch=True)
    try:
        gens = [
            rank_batches(
                name, epoch=0, start_step=0, rank=r, world_size=WORLD, plan_hash=plan.content_hash
            )
            for r in range(WORLD)
        ]
        streams: list[list] = [[] for _ in range(WORLD)]
        for mbs in zip(*gens, strict=True):  # the ranks in step, as DDP keeps them
            for s, mb in zip(streams, mbs, strict=True):
                s.append(mb)
            if mbs[0].step == lose_at:
                cluster.remove_node(nodes[1])
        history = ray.get(ray.get_actor(name).history.remote())
        alive = sum(n["Alive"] for n in ray.nodes())
    finally:
        stop_feeder(name)

    assert_exact_streams(streams, plan, tokens)
    assert [mb.step for mb in streams[0]] == list(range(plan.num_steps))
    assert alive == 2  # the head and one worker node
    report(
        f"{kind}_node_loss",
        ranges=bounds.size - 1,
        lost_at_step=lose_at,
        preparations=len(history),
        prepared_again=len(history) - (bounds.size - 1),
        rows_held=sum(h["rows_held"] for h in history),
    )
    # Every range was prepared (some maybe twice, after the loss), all under one plan hash.
    assert {h["plan_hash"] for h in history} == {plan.content_hash}
    assert {(h["start_step"], h["end_step"]) for h in history} == set(
        zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)
    )
    assert not any(h["in_feeder"] for h in history)
