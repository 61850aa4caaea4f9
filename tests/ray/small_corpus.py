"""A small parquet corpus and the run config that reads it, for the delivery tests: shards of
random tokens written with pyarrow (`write_corpus`), three buckets under a 256-token budget
(`base_cfg`)."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core.config import RunConfig

__all__ = ["EDGES", "VOCAB", "assert_exact_streams", "base_cfg", "feeder_streams", "write_corpus"]

EDGES = [0, 16, 32, 64]
VOCAB = 100


def write_corpus(
    path, lengths, *, seed=0, shards=3, rows_per_group=200, sample_ids=None, extra=None
):
    """Shards with random tokens; returns {sample_id: tokens}. `extra(i, tokens)` adds columns."""
    rng = np.random.default_rng(seed)
    os.makedirs(path, exist_ok=True)
    n = len(lengths)
    ids = np.arange(n, dtype=np.int64) * 7 + 3 if sample_ids is None else sample_ids
    order = rng.permutation(n)  # files hold samples in no particular order
    tokens = {
        int(ids[i]): rng.integers(0, VOCAB, int(lengths[i])).astype(np.int32) for i in range(n)
    }
    for s, part in enumerate(np.array_split(order, shards)):
        cols = {
            "sample_id": pa.array(ids[part]),
            "input_ids": pa.array([tokens[int(ids[i])] for i in part], pa.list_(pa.int32())),
        }
        if extra:
            cols.update(extra([int(ids[i]) for i in part], tokens))
        pq.write_table(
            pa.table(cols), os.path.join(path, f"part-{s}.parquet"), row_group_size=rows_per_group
        )
    return tokens


def base_cfg(path, **over):
    """The corpus at `path` under EDGES and a 256-token budget; each keyword updates a section."""
    raw = {
        "data": {"path": str(path)},
        "buckets": {"edges": EDGES},
        "batching": {"token_budget": 256},
        "model": {"vocab_size": VOCAB},
    }
    for k, v in over.items():
        raw.setdefault(k, {}).update(v)
    return RunConfig.model_validate(raw)


def assert_exact_streams(streams, plan, tokens, start: int = 0) -> None:
    """Every rank's stream of micro-batches is its view of `plan` from micro-batch `start` on,
    step by step, sample by sample, with the corpus's tokens (`tokens`: `write_corpus`'s)."""
    for r, stream in enumerate(streams):
        view = plan.rank_view(r)
        assert [mb.step for mb in stream] == [int(s) for s in view.steps[start:]], r
        for m, mb in enumerate(stream, start):
            want = view.sample_ids[view.offsets[m] : view.offsets[m + 1]]
            assert np.array_equal(mb.sample_ids, want), (r, m)
            for b, sid in enumerate(want):
                tok = tokens[int(sid)]
                assert np.array_equal(mb.input_ids[b, : tok.size].numpy(), tok), (r, m, b)
                assert int(mb.attention_mask[b].sum()) == tok.size, (r, m, b)


def feeder_streams(cfg, index, edges, path, world, plan_hash, *, epoch=0, start_step=0):
    """Every rank's micro-batches of `epoch` from `start_step`, served by a feeder started for
    them (no prefetch) and stopped after; returns (the streams, the feeder's history). A part of
    a plan other than `plan_hash` would be refused."""
    import uuid

    import ray

    from pipeline.data import rank_batches, start_feeder, stop_feeder

    name = f"streams-{uuid.uuid4().hex[:8]}"
    start_feeder(cfg, index, edges, name=name, path=str(path), prefetch=False)
    try:
        out = [
            list(
                rank_batches(
                    name,
                    epoch=epoch,
                    start_step=start_step,
                    rank=r,
                    world_size=world,
                    plan_hash=plan_hash,
                )
            )
            for r in range(world)
        ]
        return out, ray.get(ray.get_actor(name).history.remote())
    finally:
        stop_feeder(name)
