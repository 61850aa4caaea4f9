"""Chapters on a simulated three-node cluster (`ray.cluster_utils`): a node holding part of the
chapter being trained (and of the next, prepared ahead) is removed mid-chapter, and every rank
still gets exactly its planned sequence. Blocks lost with the node are rebuilt by Ray from their
lineage, or, failing that, the stream asks the feeder to prepare the chapter again."""

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
from tests.ray.small_corpus import base_cfg, write_corpus

pytestmark = [pytest.mark.ray, pytest.mark.slow]

WORLD = 2


@pytest.fixture
def three_nodes():
    with three_node_cluster() as (cluster, nodes):
        yield cluster, nodes


def test_node_lost_mid_chapter_keeps_every_rank_sequence_exact(three_nodes, tmp_path):
    cluster, nodes = three_nodes
    path = tmp_path / "data"
    lengths = np.random.default_rng(3).integers(1, 65, 600)
    tokens = write_corpus(str(path), lengths, shards=3, rows_per_group=50)
    # Without the row cache each chapter is read and sorted by Ray Data tasks on the two nodes.
    delivery = {"chapter_steps": 12, "row_cache": False}
    cfg = base_cfg(path, data={"cache_dir": str(tmp_path / "index")}, delivery=delivery)
    index = build_length_index(cfg)
    edges = resolve_edges(cfg, index.lengths)
    plan = epoch_plan_for(cfg, index, edges, 0, WORLD)
    bounds = plan_chapter_bounds(plan, max_steps=12, max_tokens=cfg.delivery.chapter_tokens)
    assert bounds.size - 1 >= 3
    lose_at = int(bounds[1]) + 4  # inside the second chapter, the third prepared ahead

    name = f"node-loss-{uuid.uuid4().hex[:8]}"
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

    for r, stream in enumerate(streams):
        view = plan.rank_view(r)
        assert [mb.step for mb in stream] == list(range(plan.num_steps))
        for m, mb in enumerate(stream):
            want = view.sample_ids[view.offsets[m] : view.offsets[m + 1]]
            assert np.array_equal(mb.sample_ids, want), (r, m)
            for b, sid in enumerate(want):
                tok = tokens[int(sid)]
                assert np.array_equal(mb.input_ids[b, : tok.size].numpy(), tok), (r, m, b)
    assert alive == 2  # the head and one worker node
    report(
        "chapter_node_loss",
        chapters=bounds.size - 1,
        lost_at_step=lose_at,
        preparations=len(history),
        prepared_again=len(history) - (bounds.size - 1),
    )
    # Every chapter was prepared (some maybe twice, after the loss), all under one plan hash.
    assert {h["plan_hash"] for h in history} == {plan.content_hash}
    assert {(h["start_step"], h["end_step"]) for h in history} == set(
        zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)
    )
