"""Windows on a simulated three-node cluster (`ray.cluster_utils`): without the row cache, each
window's Ray Data pass runs on the two worker nodes, and the rows a window carries into the next
are held there. A node is removed mid-window, and every rank still gets exactly its planned
sequence: lost blocks are rebuilt from their lineage, a chapter is prepared again, or a lost
held part is read again from its row groups."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import ray

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


def test_node_lost_mid_window_keeps_every_rank_sequence_exact(three_nodes, tmp_path):
    cluster, nodes = three_nodes
    path = tmp_path / "data"
    lengths = np.random.default_rng(3).integers(1, 65, 600)
    tokens = write_corpus(str(path), lengths, shards=3, rows_per_group=50)
    # Without the row cache each window is read and sorted by Ray Data tasks on the two nodes.
    cfg = base_cfg(
        path,
        data={"cache_dir": str(tmp_path / "index")},
        delivery={"row_cache": False, "lead_tokens": None},
        plan={"window_tokens": 5000},
    )
    index = build_length_index(cfg)
    edges = resolve_edges(cfg, index.lengths)
    plan = epoch_plan_for(cfg, index, edges, 0, WORLD)
    bounds = plan.window_steps
    assert bounds.size - 1 >= 3
    lose_at = int(bounds[1]) + 2  # inside the second window, the third prepared ahead

    name = f"window-node-loss-{uuid.uuid4().hex[:8]}"
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
        "window_node_loss",
        windows=bounds.size - 1,
        lost_at_step=lose_at,
        preparations=len(history),
        prepared_again=len(history) - (bounds.size - 1),
    )
    # Every window was prepared (some maybe twice, after the loss), all under one plan hash.
    assert {h["plan_hash"] for h in history} == {plan.content_hash}
    assert {(h["start_step"], h["end_step"]) for h in history} == set(
        zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)
    )
