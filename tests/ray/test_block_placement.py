"""Each rank's blocks on its own node: on a simulated three-node cluster (a head without CPUs,
two one-CPU nodes running every read and sort task), a windowed epoch's Ray Data pass leaves its
blocks where its reduce tasks ran, and the feeder then copies each rank's blocks that are not on
the rank's node to it (`pipeline.data.prepare.place_blocks`), so a rank reads its rows from its
own node's object store; the delivered rows are unchanged."""

from __future__ import annotations

import uuid

import numpy as np
import pyarrow as pa
import pytest
import ray
from ray.experimental import get_object_locations
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from pipeline.data import (
    build_length_index,
    epoch_plan_for,
    resolve_edges,
    start_feeder,
    stop_feeder,
)
from pipeline.data.prepare import place_blocks
from tests.ray.conftest import three_node_cluster
from tests.ray.small_corpus import base_cfg, write_corpus

pytestmark = [pytest.mark.ray, pytest.mark.slow]

WORLD = 2


@pytest.fixture(scope="module")
def three_nodes():
    with three_node_cluster() as (cluster, nodes):
        yield cluster, [n.node_id for n in nodes]


def _on(node: str):
    return NodeAffinitySchedulingStrategy(node, soft=False)


@ray.remote(num_cpus=0)
def _table(n: int) -> pa.Table:
    return pa.table({"x": np.arange(n)})


def _nodes_of(refs) -> list[list[str]]:
    where = get_object_locations(list(refs))
    return [sorted(where[r]["node_ids"]) for r in refs]


def test_place_blocks_copies_only_the_blocks_not_on_their_ranks_node(three_nodes):
    _, (a, b) = three_nodes
    # Blocks past Ray's inline limit (100 KiB) live in a node's store; a small one in its ref.
    on_a = [_table.options(scheduling_strategy=_on(a)).remote(n) for n in (20_000, 30_000)]
    on_b = [_table.options(scheduling_strategy=_on(b)).remote(40_000)]
    small = [_table.options(scheduling_strategy=_on(a)).remote(10)]
    ray.wait(on_a + on_b + small, num_returns=4, fetch_local=False)
    assert _nodes_of(on_a) == [[a], [a]] and _nodes_of(on_b) == [[b]] and _nodes_of(small) == [[]]

    refs, copied = place_blocks([on_a, on_b + small, on_a], [b, b, None])
    assert _nodes_of(refs[0]) == [[b], [b]]  # copied to rank 0's node
    assert refs[1] == on_b + small and refs[2] == on_a  # there already, inline; node unknown
    assert list(copied) == [a] and copied[a] >= 8 * 50_000  # the two int64 blocks, from a
    got = [ray.get(r)["x"].to_numpy() for r in refs[0]]
    assert [g.tolist() for g in got] == [list(range(20_000)), list(range(30_000))]
    assert place_blocks([[]], [a]) == ([[]], {})


@ray.remote(num_cpus=0)
class _Rank:
    """Asks the feeder for its parts as a stream does (with its node), and says where their
    blocks are and what they hold."""

    def part(self, feeder: str, epoch: int, start: int, rank: int) -> dict:
        node = ray.get_runtime_context().get_node_id()
        part = ray.get(
            ray.get_actor(feeder).part.remote(epoch, WORLD, start, rank, None, None, node)
        )
        where = get_object_locations(list(part.refs))
        stored = [r for r in part.refs if where[r]["node_ids"]]  # not inline in the ref
        sizes = [int(where[r]["object_size"] or 0) for r in stored]
        local = sum(s for r, s in zip(stored, sizes, strict=True) if node in where[r]["node_ids"])
        ids = np.concatenate([ray.get(r)["sample_id"].to_numpy() for r in part.refs])
        return {"end": part.end_step, "local": local, "bytes": sum(sizes), "ids": ids}


def test_windowed_ranks_read_their_blocks_from_their_own_node(three_nodes, tmp_path):
    _, (a, b) = three_nodes
    path = tmp_path / "data"
    # ~330K tokens: a rank's rows of a window (~50K tokens) are blocks past the inline limit.
    lengths = np.random.default_rng(5).integers(1, 65, 10_000)
    write_corpus(str(path), lengths, shards=4, rows_per_group=500)
    cfg = base_cfg(
        path,
        data={"cache_dir": str(tmp_path / "index")},
        delivery={"row_cache": False, "lead_tokens": None},
        plan={"window_tokens": 100_000},
    )
    index = build_length_index(cfg)
    edges = resolve_edges(cfg, index.lengths)
    plan = epoch_plan_for(cfg, index, edges, 0, WORLD)
    bounds = plan.window_steps.tolist()
    assert len(bounds) - 1 >= 3
    ranks = [_Rank.options(scheduling_strategy=_on(n)).remote() for n in (a, b)]
    name = f"placement-{uuid.uuid4().hex[:8]}"
    start_feeder(cfg, index, edges, name=name, path=str(path), prefetch=True)
    try:
        got = []
        for lo in bounds[:-1]:  # each window's parts, both ranks asking (the next prepared then)
            got.append(ray.get([r.part.remote(name, 0, lo, k) for k, r in enumerate(ranks)]))
            assert [g["end"] for g in got[-1]] == [bounds[len(got)]] * WORLD
        history = ray.get(ray.get_actor(name).history.remote())
    finally:
        stop_feeder(name)
    for w, parts in enumerate(got):
        for k, g in enumerate(parts):
            view = plan.rank_view(k)
            lo, hi = view.offsets[bounds[w]], view.offsets[bounds[w + 1]]
            assert np.array_equal(g["ids"], view.sample_ids[lo:hi]), (w, k)
            if w > 0:  # prepared once both ranks had said where they are: all on their node
                assert g["local"] == g["bytes"] > 0, (w, k, g["local"], g["bytes"])
    placed = [h["bytes_placed"] for h in history if h["start_step"] > 0]
    assert sum(placed) > 0, history  # the passes' reduce tasks did put some blocks elsewhere
