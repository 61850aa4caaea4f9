"""The row cache at delivery: chapters served from its files deliver exactly what parquet does,
parquet is decoded once per row group (not once per chapter), a new feeder on a warm cache
reads no parquet even for its lead-in, storage errors while filling are retried, and a cache
file that does not match the index is read again."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
import ray

from pipeline.data import (
    RetryPolicy,
    build_length_index,
    rank_batches,
    resolve_edges,
    start_feeder,
    stop_feeder,
)
from tests.flaky_fs import flaky_fs, opens
from tests.ray.small_corpus import base_cfg, write_corpus
from tests.ray.test_chapters_delivery import assert_same_streams

pytestmark = pytest.mark.ray

FAST = RetryPolicy(attempts=3, backoff_s=0.05, max_backoff_s=0.1)
WORLD = 2
CHAPTER_STEPS = 9


class Data:
    def __init__(self, path):
        self.path = str(path / "data")
        lengths = np.random.default_rng(13).integers(1, 65, 600)
        self.tokens = write_corpus(self.path, lengths, shards=3, rows_per_group=50)
        self.parquet_cfg = self.cfg(row_cache=False)
        self.index = build_length_index(self.parquet_cfg)
        self.edges = resolve_edges(self.parquet_cfg, self.index.lengths)
        self.row_groups = sum(len(r) for r in self.index.row_groups)
        self.reference = {e: self.streams(self.parquet_cfg, e)[0] for e in (0, 1)}

    def cfg(self, **delivery):
        delivery = {"chapter_steps": CHAPTER_STEPS, "lead_tokens": None} | delivery
        return base_cfg(self.path, train={"epochs": 2}, delivery=delivery)

    def streams(self, cfg, epoch, prefetch=False, **kw):
        name = f"rows-{uuid.uuid4().hex[:8]}"
        start_feeder(
            cfg, self.index, self.edges, name=name, path=self.path, prefetch=prefetch, **kw
        )
        try:
            out = [
                list(rank_batches(name, epoch=epoch, start_step=0, rank=r, world_size=WORLD))
                for r in range(WORLD)
            ]
            return out, ray.get(ray.get_actor(name).history.remote())
        finally:
            stop_feeder(name)


@pytest.fixture(scope="module")
def data(cluster, tmp_path_factory):
    return Data(tmp_path_factory.mktemp("rowcache"))


def _cache_files(root):
    return sorted(p for p in os.listdir(root) if p.endswith(".arrow"))


def test_chapters_from_the_row_cache_deliver_what_parquet_does_decoding_each_row_group_once(
    data, tmp_path
):
    cfg = data.cfg(row_cache_dir=str(tmp_path / "rows"))
    got, status = data.streams(cfg, 0)
    assert_same_streams(got, data.reference[0])
    assert len(status) >= 4, "several chapters"
    # every row group was decoded once, by whichever chapter first needed it; none from parquet
    assert sum(s["rg_filled"] for s in status) == data.row_groups
    assert all(s["rg_parquet"] == 0 and s["in_feeder"] for s in status)
    assert all(s["rg_cached"] + s["rg_filled"] == s["row_groups_read"] for s in status)
    assert len(_cache_files(tmp_path / "rows")) == data.row_groups
    # the next epoch (another order) comes from the files alone
    got, status = data.streams(cfg, 1)
    assert_same_streams(got, data.reference[1])
    assert all(s["rg_filled"] == 0 and s["rg_parquet"] == 0 for s in status)


def test_a_new_feeder_on_a_warm_row_cache_reads_no_parquet_even_for_its_lead_in(data, tmp_path):
    rows = str(tmp_path / "rows")
    data.streams(data.cfg(row_cache_dir=rows), 0)  # fills it
    fs = flaky_fs("part-1.parquet", tmp_path / "opens", fail_count=0)
    led = data.cfg(row_cache_dir=rows, lead_tokens=40)
    got, status = data.streams(led, 0, filesystem=fs)
    assert_same_streams(got, data.reference[0])
    assert status[0]["end_step"] < CHAPTER_STEPS  # a lead-in ran: a first range of < 1 chapter
    assert opens(fs) == 0 and all(s["rg_parquet"] == 0 for s in status)
    # and on a cold cache the lead-in's small ranges read just their rows, filling nothing
    cold = data.cfg(row_cache_dir=str(tmp_path / "cold"), lead_tokens=40)
    got, status = data.streams(cold, 0)
    assert_same_streams(got, data.reference[0])
    assert status[0]["rg_filled"] == 0 and status[0]["rg_parquet"] > 0


def test_storage_errors_while_filling_the_row_cache_are_retried_and_counted(data, tmp_path):
    fs = flaky_fs("part-1.parquet", tmp_path / "opens", fail_count=2)
    cfg = data.cfg(row_cache_dir=str(tmp_path / "rows"), chapter_steps=None)  # one chapter
    got, status = data.streams(cfg, 0, filesystem=fs, retry=FAST)
    assert_same_streams(got, data.reference[0])
    ((stats),) = status
    assert stats["read_retries"] == 2 and stats["rg_filled"] == data.row_groups
    assert opens(fs) == len(data.index.row_groups[1]) + 2  # each of its row groups once, + 2


def test_a_row_cache_file_that_does_not_match_the_index_is_read_again(data, tmp_path):
    root = tmp_path / "rows"
    cfg = data.cfg(row_cache_dir=str(root))
    data.streams(cfg, 0)
    files = _cache_files(root)
    # one file garbled, another holding a different row group's rows
    with open(root / files[0], "wb") as f:
        f.write(b"garbled")
    (root / files[2]).write_bytes((root / files[1]).read_bytes())
    got, status = data.streams(cfg, 1)
    assert_same_streams(got, data.reference[1])
    assert sum(s["rg_filled"] for s in status) == 2
    assert (root / files[2]).read_bytes() != (root / files[1]).read_bytes()  # rewritten
