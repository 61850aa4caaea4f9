"""Windows at delivery: a windowed epoch (`plan.window_tokens`) is served window by window, each
window one chapter, and every rank trains exactly its view of the windowed plan, from the start,
from a resume inside a window, and on another number of workers; each window's Ray Data pass
reads its own row groups and those of the rows carried into it (with windows the row cache and
the lead-in are off unless asked for; the first test asks for both)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.core.chapters import row_group_of
from pipeline.core.epochs import epoch_windows
from pipeline.core.windows import carried_rows, trained_windows
from pipeline.data import (
    build_length_index,
    epoch_plan_for,
    resolve_edges,
)
from tests.ray.small_corpus import base_cfg, feeder_streams, write_corpus

pytestmark = pytest.mark.ray

WINDOW_TOKENS = 5000  # the corpus holds ~19.5K real tokens in 12 row groups: 4 windows


class Data:
    def __init__(self, path):
        self.path = str(path)
        lengths = np.random.default_rng(5).integers(1, 65, 600)
        self.tokens = write_corpus(self.path, lengths, shards=3, rows_per_group=50)
        self.cfg = base_cfg(self.path, train={"epochs": 2}, plan={"window_tokens": WINDOW_TOKENS})
        self.index = build_length_index(self.cfg)
        self.edges = resolve_edges(self.cfg, self.index.lengths)

    def plan(self, epoch, world):
        return epoch_plan_for(self.cfg, self.index, self.edges, epoch, world)

    def streams(self, cfg, world, epoch=0, start_step=0):
        h = self.plan(epoch, world).content_hash
        return feeder_streams(
            cfg, self.index, self.edges, self.path, world, h, epoch=epoch, start_step=start_step
        )


@pytest.fixture(scope="module")
def data(cluster, tmp_path_factory):
    return Data(tmp_path_factory.mktemp("windows"))


def _ids(stream):
    return np.concatenate([mb.sample_ids for mb in stream])


@pytest.mark.parametrize("epoch", [0, 1])
def test_windows_each_window_is_a_chapter_and_every_rank_trains_its_view(data, epoch):
    plan = data.plan(epoch, 2)
    assert plan.window_steps is not None and plan.window_steps.size - 1 == 4
    cfg = data.cfg.model_copy(deep=True)  # read in the feeder, from the row cache, after a lead-in
    cfg.delivery.row_cache, cfg.delivery.lead_tokens = True, 1000
    streams, status = data.streams(cfg, 2, epoch=epoch)
    assert all(s["in_feeder"] for s in status)
    for r, stream in enumerate(streams):
        assert np.array_equal(_ids(stream), plan.rank_view(r).sample_ids)
        assert [mb.step for mb in stream] == list(range(plan.num_steps))
    ranges = [(s["start_step"], s["end_step"]) for s in status if not s.get("lead_in")]
    ws = plan.window_steps.tolist()
    assert ranges[-3:] == list(zip(ws[1:-1], ws[2:], strict=True))
    assert {s["plan_hash"] for s in status} == {plan.content_hash}


def test_windows_resume_inside_a_window_on_another_world_size(data):
    plan2 = data.plan(0, 2)
    start = int(plan2.window_steps[2]) + 2  # inside the third window
    streams, _ = data.streams(data.cfg, 1, start_step=start)
    assert streams[0][0].step == start
    # one rank trains the same global batches the two ranks trained (contract 8)
    want = plan2.sample_ids[plan2.step_offsets[start - plan2.first_step] :]
    assert np.array_equal(_ids(streams[0]), want)


def test_windows_read_each_row_group_exactly_once_per_epoch(data):
    """With the delivery section at its defaults (no row cache, no lead-in with windows) each
    window's Ray Data pass reads its own row groups, once: the rows it trains and those it
    carries out, which the next window's pass takes held; the feeder reads no rows."""
    assert data.cfg.delivery.row_cache is None and data.cfg.delivery.lead_tokens == "auto"
    plan = data.plan(0, 2)
    streams, status = data.streams(data.cfg, 2)
    assert not any(s["in_feeder"] for s in status)
    for r, stream in enumerate(streams):
        assert np.array_equal(_ids(stream), plan.rank_view(r).sample_ids)
        for mb in stream:  # the held rows' tokens are the corpus's
            for i, sid in enumerate(mb.sample_ids[:2]):
                n = int(mb.attention_mask[i].sum())
                assert np.array_equal(mb.input_ids[i, :n].numpy(), data.tokens[int(sid)])
    pos = np.searchsorted(data.index.sample_ids, plan.sample_ids)
    window = epoch_windows(data.cfg, data.index, 0)[pos]
    carried = carried_rows(plan, window)
    step = np.repeat(np.arange(plan.num_steps), np.diff(plan.step_offsets))
    trained = np.searchsorted(plan.window_steps, step, side="right") - 1
    rg_all = row_group_of(data.index.file_idx, data.index.rows, data.index.row_groups)
    rg = rg_all[pos]
    assert len(status) == 4
    for w, s in enumerate(status):
        assert s["row_groups_read"] == np.unique(rg[window == w]).size
        assert s["rows_held"] == int((carried & (trained == w)).sum()) and (s["rows_held"] > 0) == (
            w > 0
        )
        assert s["rows_carried_out"] == int((carried & (window == w)).sum())
        assert s["rows_sorted"] == int((trained == w).sum())
    # every row group of the corpus, read exactly once in the epoch
    assert sum(s["row_groups_read"] for s in status) == np.unique(rg_all).size


def test_windows_rows_carried_for_several_windows_are_read_once(data):
    """Sixteen buckets in windows of two row groups: a bucket with less than a batch in a window
    carries it on, so rows train up to five windows after their own and the first window trains
    no step. Every rank still trains exactly its view, and each row group is read once."""
    cfg = data.cfg.model_copy(deep=True)
    cfg.buckets.edges = list(range(0, 65, 4))
    cfg.batching.token_budget = 1024
    cfg.plan.window_tokens = 3600
    edges = resolve_edges(cfg, data.index.lengths)
    plan = epoch_plan_for(cfg, data.index, edges, 0, 2)
    pos = np.searchsorted(data.index.sample_ids, plan.sample_ids)
    late = trained_windows(plan) - epoch_windows(cfg, data.index, 0)[pos]
    assert late.max() >= 2 and (np.diff(plan.window_steps) == 0).any()  # the case itself
    streams, status = feeder_streams(cfg, data.index, edges, data.path, 2, plan.content_hash)
    for r, stream in enumerate(streams):
        assert np.array_equal(_ids(stream), plan.rank_view(r).sample_ids)
    rg_all = row_group_of(data.index.file_idx, data.index.rows, data.index.row_groups)
    assert sum(s["row_groups_read"] for s in status) == np.unique(rg_all).size
    # every carried row is taken held, but those the first pass trains (the empty first
    # window's: no pass before it to hold them)
    trained = trained_windows(plan)
    assert sum(s["rows_held"] for s in status) == int(((late > 0) & (trained > trained[0])).sum())


def test_windows_a_fresh_feeder_reads_the_carried_in_rows_again(data):
    """A resume in a window, on a feeder that held nothing, reads the rows carried into it from
    their row groups: nothing is missing."""
    plan = data.plan(0, 2)
    start = int(plan.window_steps[2])
    streams, status = data.streams(data.cfg, 2, start_step=start)
    for r, stream in enumerate(streams):
        view = plan.rank_view(r)
        assert np.array_equal(_ids(stream), view.sample_ids[view.offsets[start] :])
    assert status[0]["rows_held"] == 0 and status[1]["rows_held"] > 0
