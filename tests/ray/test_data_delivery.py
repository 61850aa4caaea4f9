"""Ray Data delivery (contracts 1-4, 6, 7 data side): per-rank streams from a local Ray cluster.

Small parquet corpora written with pyarrow; consumers are the driver itself or plain Ray tasks
calling `rank_batches`, which is all a Ray Train worker does.
"""

from __future__ import annotations

import os
import time
import uuid

import numpy as np
import pyarrow as pa
import pytest
import ray

from pipeline.core.collate import IGNORE_INDEX
from pipeline.core.config import RunConfig
from pipeline.data import (
    build_length_index,
    epoch_plan_for,
    rank_batches,
    resolve_data_path,
    resolve_edges,
    start_feeder,
)
from pipeline.data.corpus import MARKER
from tests.ray.small_corpus import EDGES, base_cfg, write_corpus

pytestmark = pytest.mark.ray

# token_budget 256 gives global batches of 16, 8 and 4 samples; these bucket counts leave
# remainders of 1, 2 and 1 samples, so 2 and 3 ranks get empty micro-batches (contract 4).
COUNTS = (16 * 40 + 1, 8 * 50 + 2, 4 * 100 + 1)


class Corpus:
    def __init__(self, path):
        rng = np.random.default_rng(7)
        self.lengths = np.concatenate(
            [
                rng.integers(lo + 1, hi + 1, c)
                for (lo, hi), c in zip(zip(EDGES, EDGES[1:], strict=False), COUNTS, strict=True)
            ]
        )
        self.path = str(path)
        self.tokens = write_corpus(self.path, self.lengths)
        self.cfg = base_cfg(self.path, train={"epochs": 3})  # epoch 1 exists, so it is prefetched
        self.index = build_length_index(self.cfg)
        self.edges = resolve_edges(self.cfg, self.index.lengths)
        self._streams = {}

    def feeder(self, prefetch=False):
        # Prefetching is off unless a test checks it: a background sort nobody reads only
        # competes for the two CPUs.
        name = f"feeder-{uuid.uuid4().hex[:8]}"
        start_feeder(self.cfg, self.index, self.edges, name=name, path=self.path, prefetch=prefetch)
        return name

    def streams(self, world, epoch=0, start_step=0, name=None):
        """Per-rank lists of micro-batches, consumed on the driver; memoised per key."""
        key = (world, epoch, start_step, name)
        if key not in self._streams:
            name = name or self.feeder()
            self._streams[key] = [
                list(
                    rank_batches(name, epoch=epoch, start_step=start_step, rank=r, world_size=world)
                )
                for r in range(world)
            ]
        return self._streams[key]


@pytest.fixture(scope="module")
def corpus(cluster, tmp_path_factory):
    return Corpus(tmp_path_factory.mktemp("corpus"))


def ids_per_rank(streams):
    return [np.concatenate([mb.sample_ids for mb in s]) for s in streams]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_contract4_lossless_each_sample_once(corpus, world):
    ids = np.concatenate(ids_per_rank(corpus.streams(world)))
    assert ids.size == corpus.index.num_samples == sum(COUNTS)
    assert np.array_equal(np.sort(ids), corpus.index.sample_ids)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_contract3_equal_steps_and_same_bucket_at_each_step(corpus, world):
    streams = corpus.streams(world)
    plan = epoch_plan_for(corpus.cfg, corpus.index, corpus.edges, 0, world)
    for s in streams:
        assert [mb.step for mb in s] == list(range(plan.num_steps))
        assert np.array_equal([mb.bucket for mb in s], plan.step_bucket)


@pytest.mark.parametrize("world", [2, 3])
def test_contract4_empty_micro_batches_come_through(corpus, world):
    empty = [mb for s in corpus.streams(world) for mb in s if mb.sample_ids.size == 0]
    assert empty, "the corpus is built to leave remainders smaller than the world size"
    for mb in empty:
        for t in (mb.input_ids, mb.attention_mask, mb.labels, mb.position_ids):
            assert tuple(t.shape) == (0, 0)
        assert mb.num_real_tokens == 0 == mb.num_padded_tokens


def test_contract6_determinism_two_runs_identical_per_rank_ids(corpus):
    first = ids_per_rank(corpus.streams(2))
    second = ids_per_rank(corpus.streams(2, name=corpus.feeder()))
    plan = epoch_plan_for(corpus.cfg, corpus.index, corpus.edges, 0, 2)
    for r in range(2):
        assert np.array_equal(first[r], second[r])
        assert np.array_equal(first[r], plan.rank_view(r).sample_ids)  # the plan, not scheduling


def test_contract1_epoch1_differs_from_epoch0_and_is_prefetched(corpus):
    name = corpus.feeder(prefetch=True)
    e0 = ids_per_rank(corpus.streams(2, epoch=0, name=name))

    def epoch1_started() -> bool:
        status = ray.get(ray.get_actor(name).status.remote())
        return any(s.get("epoch") == 1 or s.get("key", (None,))[0] == 1 for s in status)

    # The next epoch is planned on the feeder's preparing thread once every rank asked for the
    # last chapter, so it shows up shortly after, not necessarily by the time epoch 0 is read.
    deadline = time.monotonic() + 60
    while not epoch1_started() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert epoch1_started()
    e1 = ids_per_rank(corpus.streams(2, epoch=1, name=name))
    assert not np.array_equal(e0[0], e1[0])
    assert np.array_equal(np.sort(np.concatenate(e1)), corpus.index.sample_ids)


def test_contract7_stream_from_step_equals_tail(corpus):
    full = corpus.streams(2)
    start = len(full[0]) // 2 + 3
    name = corpus.feeder()
    tail = corpus.streams(2, start_step=start, name=name)
    for r in range(2):
        assert len(tail[r]) == len(full[r]) - start
        for a, b in zip(full[r][start:], tail[r], strict=True):
            assert (a.step, a.bucket) == (b.step, b.bucket)
            assert np.array_equal(a.sample_ids, b.sample_ids)
            assert all(
                (getattr(a, k) == getattr(b, k)).all()
                for k in ("input_ids", "attention_mask", "labels", "position_ids")
            )
    # Consumed samples were neither sorted nor delivered.
    (stats,) = ray.get(ray.get_actor(name).history.remote())
    remaining = sum(mb.sample_ids.size for s in tail for mb in s)
    assert stats["start_step"] == start and stats["rows_sorted"] == remaining
    assert remaining < corpus.index.num_samples


def _slow_reference(rows, upper, multiple=8, labels=None):
    """Per-token Python padding, independent of pipeline.core.collate."""
    B, maxlen = len(rows), max((len(r) for r in rows), default=0)
    L = min(-(-maxlen // multiple) * multiple, upper) if B else 0
    out = {k: np.zeros((B, L), np.int64) for k in ("input_ids", "attention_mask", "position_ids")}
    out["labels"] = np.full((B, L), IGNORE_INDEX, np.int64)
    for b, r in enumerate(rows):
        for j, tok in enumerate(r):
            out["input_ids"][b, j] = tok
            out["attention_mask"][b, j] = 1
            out["position_ids"][b, j] = j
            out["labels"][b, j] = tok if labels is None else labels[b][j]
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_contract2_padded_tensors_match_slow_reference(corpus, world):
    for s in corpus.streams(world):
        for mb in s:
            ref = _slow_reference(
                [corpus.tokens[int(i)] for i in mb.sample_ids], EDGES[mb.bucket + 1]
            )
            for k, v in ref.items():
                assert np.array_equal(getattr(mb, k).numpy(), v), (mb.step, k)
            assert mb.num_real_tokens == sum(len(corpus.tokens[int(i)]) for i in mb.sample_ids)


@ray.remote(num_cpus=0.5)
def _consume(name, epoch, rank, world):
    return [
        (mb.step, mb.bucket, mb.sample_ids, int(mb.input_ids.sum()))
        for mb in rank_batches(name, epoch=epoch, start_step=0, rank=rank, world_size=world)
    ]


def test_contract6_remote_consumers_get_the_driver_streams(corpus):
    name = corpus.feeder()
    got = ray.get([_consume.remote(name, 0, r, 2) for r in range(2)])
    for r, stream in enumerate(corpus.streams(2)):
        assert len(got[r]) == len(stream)
        for (step, bucket, ids, total), mb in zip(got[r], stream, strict=True):
            assert (step, bucket) == (mb.step, mb.bucket)
            assert np.array_equal(ids, mb.sample_ids) and total == int(mb.input_ids.sum())


def test_loss_mask_and_labels_become_labels(cluster, tmp_path):
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 65, 150)
    masks = {}

    def with_mask(ids, tokens):
        for i in ids:
            masks[i] = (rng.random(len(tokens[i])) < 0.5).astype(np.int8)
        return {"loss_mask": pa.array([masks[i] for i in ids], pa.list_(pa.int8()))}

    tokens = write_corpus(tmp_path / "m", lengths, extra=with_mask, shards=2)
    cfg = base_cfg(tmp_path / "m")
    index = build_length_index(cfg)
    assert index.supervision == "loss_mask"
    name = f"mask-{uuid.uuid4().hex[:6]}"
    start_feeder(cfg, index, EDGES, name=name, path=str(tmp_path / "m"), prefetch=False)
    seen = 0
    for mb in rank_batches(name, epoch=0, start_step=0, rank=0, world_size=1):
        rows = [tokens[int(i)] for i in mb.sample_ids]
        labels = [np.where(masks[int(i)] != 0, tokens[int(i)], IGNORE_INDEX) for i in mb.sample_ids]
        ref = _slow_reference(rows, EDGES[mb.bucket + 1], labels=labels)
        assert np.array_equal(mb.labels.numpy(), ref["labels"])
        assert np.array_equal(mb.input_ids.numpy(), ref["input_ids"])
        seen += mb.sample_ids.size
    assert seen == 150


def test_index_is_cached_and_invalidated_by_a_changed_shard(cluster, tmp_path):
    write_corpus(tmp_path / "c", np.full(60, 10), shards=2)
    cfg = base_cfg(tmp_path / "c")
    first = build_length_index(cfg)
    again = build_length_index(cfg)
    assert not first.from_cache and again.from_cache
    assert (
        np.array_equal(first.sample_ids, again.sample_ids)
        and first.fingerprint == again.fingerprint
    )
    write_corpus(tmp_path / "c", np.full(60, 12), shards=2)  # rewrite: new sizes and mtimes
    changed = build_length_index(cfg)
    assert not changed.from_cache and changed.fingerprint != first.fingerprint
    assert (changed.lengths == 12).all()


def test_synthetic_default_config_end_to_end(cluster, tmp_path):
    out = tmp_path / "synthetic"
    cfg = RunConfig.model_validate(
        {
            "data": {"synthetic": {"num_samples": 400, "shards": 2, "out_dir": str(out)}},
            "batching": {"token_budget": 16384},
        }
    )
    path = resolve_data_path(cfg)
    assert (out / MARKER).is_file()
    mtime = os.path.getmtime(out / "shard-00000.parquet")
    assert resolve_data_path(cfg) == path and os.path.getmtime(out / "shard-00000.parquet") == mtime
    index = build_length_index(cfg, path)
    assert index.num_samples == 400 and index.lengths.min() >= 16
    edges = resolve_edges(cfg, index.lengths)  # buckets.num_buckets: auto
    name = f"syn-{uuid.uuid4().hex[:6]}"
    start_feeder(cfg, index, edges, name=name, path=path, prefetch=False)
    ids = [
        mb.sample_ids
        for r in range(2)
        for mb in rank_batches(name, epoch=0, start_step=0, rank=r, world_size=2)
    ]
    assert np.array_equal(np.sort(np.concatenate(ids)), np.arange(400))
