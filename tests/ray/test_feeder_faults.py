"""Delivery under faults: flaky storage, a failed prefetch, a killed feeder, a foreign plan, bad
token values. Each stream that survives must be exactly the undisturbed one (the plan's view,
micro-batch by micro-batch, with the file's tokens); each fault that cannot be survived must
name its cause. Consumers are the driver itself, which is all a Ray Train worker does.
"""

from __future__ import annotations

import os
import time
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from ray.exceptions import OwnerDiedError

import pipeline.data.stream as data_stream
from pipeline.data import (
    DataError,
    PlanMismatchError,
    RetryPolicy,
    build_length_index,
    epoch_plan_for,
    rank_batches,
    resolve_edges,
    start_feeder,
    stop_feeder,
)
from tests.flaky_fs import flaky_fs, opens
from tests.ray.small_corpus import assert_exact_streams, base_cfg, write_corpus

pytestmark = pytest.mark.ray

FAST = RetryPolicy(attempts=3, backoff_s=0.05, max_backoff_s=0.1)
SHARDS, ROWS_PER_GROUP = 3, 50


class Data:
    def __init__(self, path):
        self.path = str(path)
        self.lengths = np.random.default_rng(11).integers(1, 65, 450)
        self.tokens = write_corpus(
            self.path, self.lengths, shards=SHARDS, rows_per_group=ROWS_PER_GROUP
        )
        # Every preparation reads parquet here (faults of the storage are the subject); the row
        # cache, which serves later chapters from its own files, is tested in test_row_cache.
        self.cfg = base_cfg(self.path, train={"epochs": 2}, delivery={"row_cache": False})
        self.index = build_length_index(self.cfg)
        self.edges = resolve_edges(self.cfg, self.index.lengths)

    def feeder(self, cfg=None, **kw) -> str:
        """A feeder of this corpus for `cfg` (default: this module's), no prefetch unless asked."""
        name = f"faults-{uuid.uuid4().hex[:8]}"
        kw.setdefault("prefetch", False)
        cfg = self.cfg if cfg is None else cfg
        start_feeder(cfg, self.index, self.edges, name=name, path=self.path, **kw)
        return name

    def plan(self, epoch, world):
        return epoch_plan_for(self.cfg, self.index, self.edges, epoch, world)

    def assert_undisturbed(self, streams, epoch):
        """Every rank's stream is its plan view, micro-batch by micro-batch, with its tokens."""
        assert_exact_streams(streams, self.plan(epoch, len(streams)), self.tokens)


@pytest.fixture(scope="module")
def data(cluster, tmp_path_factory):
    return Data(tmp_path_factory.mktemp("faults"))


def _streams(name, epoch=0, world=2):
    return [
        list(rank_batches(name, epoch=epoch, start_step=0, rank=r, world_size=world))
        for r in range(world)
    ]


def _status(name):
    return ray.get(ray.get_actor(name).status.remote())


def _history(name):
    """Stats of the preparations so far (status() drops chapters every rank has finished)."""
    return ray.get(ray.get_actor(name).history.remote())


def test_transient_read_errors_are_retried_counted_and_change_nothing(data, tmp_path):
    fs = flaky_fs("part-1.parquet", tmp_path / "opens", fail_count=2)
    name = data.feeder(filesystem=fs, retry=FAST)
    try:
        data.assert_undisturbed(_streams(name), epoch=0)
        (stats,) = _history(name)
    finally:
        stop_feeder(name)
    assert stats["read_retries"] == 2  # each "503 Slow Down" cost one retry, no more
    assert opens(fs) == 3 + 2 and stats["row_groups_read"] == 3 * SHARDS  # 3 row groups + 2


def test_failed_prefetch_is_prepared_again_when_its_epoch_is_requested(data, tmp_path):
    # Opens of part-1 fail from epoch 1's preparation on (epoch 0 opens its 3 row groups once)
    # until the storage "heals"; epoch 1 is prepared in the background while epoch 0 streams.
    fs = flaky_fs("part-1.parquet", tmp_path / "opens", fail_count=10**6, fail_from=3)
    name = data.feeder(filesystem=fs, retry=FAST, prefetch=True)
    try:
        data.assert_undisturbed(_streams(name, epoch=0), epoch=0)
        deadline = time.monotonic() + 300
        while not any(s.get("key", (None,))[0] == 1 and s.get("error") for s in _status(name)):
            assert time.monotonic() < deadline, _status(name)
            time.sleep(0.5)
        (failed,) = [s for s in _status(name) if s.get("key", (None,))[0] == 1]
        assert "part-1.parquet: row group" in failed["error"] and "3 attempts" in failed["error"]
        fs.handler.heal()
        data.assert_undisturbed(_streams(name, epoch=1), epoch=1)
    finally:
        stop_feeder(name)


def _kill_feeder_mid_epoch(data, monkeypatch, cfg, heads: tuple[int, int]):
    """Two ranks' streams of epoch 0 from a feeder killed once rank r has taken heads[r]
    micro-batches; returns (the streams, the restarted feeder's history)."""
    # On one node, Ray keeps a dead owner's blocks readable until the object store evicts
    # them; on a cluster, fetching one from another node fails at once. The test makes that
    # loss explicit: once the feeder is killed, fetching a block it made raises OwnerDiedError.
    killed, doomed, real = [False], set(), data_stream._prefetched_blocks

    def blocks(refs, ahead=2):
        if not killed[0]:
            doomed.update(refs)
        for ref, table in zip(refs, real(refs, ahead), strict=True):
            if killed[0] and ref in doomed:
                raise OwnerDiedError(ref.hex(), None, "")
            yield table

    monkeypatch.setattr(data_stream, "_prefetched_blocks", blocks)
    name = data.feeder(cfg, block_bytes=2048)  # ~13 rows a block: most blocks are still unread
    feeder = ray.get_actor(name)
    gens = [rank_batches(name, epoch=0, start_step=0, rank=r, world_size=2) for r in range(2)]
    firsts = [[next(g) for _ in range(n)] for g, n in zip(gens, heads, strict=True)]
    pid = ray.get(feeder.__ray_call__.remote(lambda self: os.getpid()))
    ray.kill(feeder, no_restart=False)  # what an OOM kill does to the actor's process
    killed[0] = True
    try:
        streams = [head + list(g) for head, g in zip(firsts, gens, strict=True)]
        new_pid = ray.get(feeder.__ray_call__.remote(lambda self: os.getpid()))
        restarted = _history(name)
    finally:
        stop_feeder(name)
    assert new_pid != pid
    return streams, restarted


def test_killed_feeder_mid_epoch_streams_go_on_with_the_exact_sequence(data, monkeypatch):
    streams, restarted = _kill_feeder_mid_epoch(data, monkeypatch, data.cfg, (5, 3))
    # The restarted feeder prepared epoch 0 again from its constructor arguments, once for
    # both ranks, and each stream went on after the micro-batches it had yielded.
    assert [(s["epoch"], s["start_step"]) for s in restarted] == [(0, 0)]
    data.assert_undisturbed(streams, epoch=0)


def test_killed_feeder_mid_window_streams_go_on_with_the_exact_sequence(data, monkeypatch):
    """Windows: the feeder killed inside the second window, after its pass took the rows the
    first window carried into it. The restarted feeder holds nothing: it prepares that window
    again, reading the carried rows from their row groups, and every stream goes on exactly."""
    cfg = data.cfg.model_copy(deep=True)
    cfg.plan.window_tokens = 4800  # about three row groups a window: three windows
    plan = epoch_plan_for(cfg, data.index, data.edges, 0, 2)
    ws = plan.window_steps
    assert ws is not None and ws.size - 1 == 3 and ws[2] - ws[1] > 4, ws
    views = [plan.rank_view(r) for r in range(2)]
    # each rank two micro-batches past the second window's first step
    heads = tuple(int(np.searchsorted(v.steps, ws[1])) + 2 for v in views)
    streams, restarted = _kill_feeder_mid_epoch(data, monkeypatch, cfg, heads)
    assert_exact_streams(streams, plan, data.tokens)
    # the window in progress prepared again from its start, its carried-in rows read, not held
    first = restarted[0]
    assert (first["start_step"], first["end_step"]) == (int(ws[1]), int(ws[2]))
    assert first["rows_held"] == 0 and not first["in_feeder"]
    assert [s["start_step"] for s in restarted] == [int(ws[1]), int(ws[2])]


def test_stream_refuses_a_feeder_serving_another_plan(data):
    name = data.feeder()
    good = data.plan(0, 1).content_hash
    try:
        ok = list(rank_batches(name, epoch=0, start_step=0, rank=0, world_size=1, plan_hash=good))
        stream = rank_batches(
            name, epoch=0, start_step=0, rank=0, world_size=1, plan_hash="0" * len(good)
        )
        with pytest.raises(PlanMismatchError, match=f"hash {good}, this run planned 0000"):
            next(stream)
    finally:
        stop_feeder(name)
    data.assert_undisturbed([ok], epoch=0)


def test_shard_rewritten_with_out_of_range_tokens_is_named_not_delivered(cluster, tmp_path):
    d = tmp_path / "d"
    write_corpus(d, np.full(120, 10), shards=2, rows_per_group=20)
    cfg = base_cfg(d)
    index = build_length_index(cfg)
    # Rewritten after indexing with the same ids and lengths: uint64 tokens, one of them >= 2**63
    # (it would wrap to a small id when narrowed to int32 and train on the wrong token).
    path = d / "part-1.parquet"
    t = pq.read_table(path)
    ids = t["input_ids"].to_pylist()
    ids[47][3] = 2**63 + 5
    t = t.set_column(1, "input_ids", pa.array(ids, pa.list_(pa.uint64())))
    pq.write_table(t, path, row_group_size=20)
    name = f"range-{uuid.uuid4().hex[:6]}"
    start_feeder(cfg, index, [0, 16], name=name, path=str(d), prefetch=False)
    try:
        with pytest.raises(DataError) as e:
            list(rank_batches(name, epoch=0, start_step=0, rank=0, world_size=1))
    finally:
        stop_feeder(name)
    # The rewrite changed every row group's content (the token type too), so the first row group
    # read is named; the token-range check itself, which names the sample, is unit-tested in
    # tests/unit/test_read_rows.py.
    msg = str(e.value)
    assert f"{path}: row group 0 changed since indexing" in msg, msg
