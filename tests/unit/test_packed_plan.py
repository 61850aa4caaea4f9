"""A packed epoch as the plan delivery uses: rank views of whole rows, keys, slices and chapters
that cut it only at step boundaries, and worker-side re-chunking that yields the planned rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipeline.core.chapters import chapter_bounds, chapter_plan, step_tokens
from pipeline.core.config import ConfigError
from pipeline.core.packed_collate import collate_packed
from pipeline.core.packing import PackingSpec, pack_epoch
from pipeline.data.rechunk import deliver

SPEC = PackingSpec(row_tokens=256, rows_per_step=8, attention_width=64, balance_rows=32)


def _plan(world_size=4, n=600, seed=0):
    lengths = np.random.default_rng(seed).integers(1, 200, n)
    return lengths, pack_epoch(
        lengths, [0, 256], seed=seed, epoch=1, world_size=world_size, spec=SPEC
    )


def _rank_rows(plan, rank):
    """Each micro-batch of the rank as a list of rows (tuples of sample ids)."""
    v = plan.rank_view(rank)
    out = []
    for m in range(v.offsets.size - 1):
        rows = v.row_offsets[v.micro_rows[m] : v.micro_rows[m + 1] + 1]
        out.append([tuple(v.sample_ids[a:b]) for a, b in zip(rows[:-1], rows[1:], strict=True)])
    return out


def test_micro_batches_are_whole_rows_an_equal_share_of_each_step():
    _, plan = _plan(world_size=4)
    assert plan.packed
    row_offsets = plan.rows.row_offsets
    assert np.array_equal(plan.micro_offsets, row_offsets[plan.micro_rows])
    all_rows = {
        tuple(plan.sample_ids[a:b]) for a, b in zip(row_offsets[:-1], row_offsets[1:], strict=True)
    }
    seen = []
    for r in range(4):
        per_mb = _rank_rows(plan, r)
        assert len(per_mb) == plan.num_steps  # one micro-batch per step (contract 3)
        full = np.diff(plan.rows.step_rows) == SPEC.rows_per_step
        assert all(len(mb) == 2 for mb, f in zip(per_mb, full, strict=True) if f)
        seen += [row for mb in per_mb for row in mb]
    assert sorted(seen) == sorted(all_rows)  # every row once, never cut


def test_contract8_the_same_rows_on_another_world_size_and_refusals():
    _, plan = _plan(world_size=4)
    for w in (1, 2, 8):
        other = plan.with_world_size(w)
        assert other.content_hash == plan.content_hash
        rows = sorted(row for r in range(w) for mb in _rank_rows(other, r) for row in mb)
        assert rows == sorted(row for r in range(4) for mb in _rank_rows(plan, r) for row in mb)
    with pytest.raises(ConfigError, match="rows_per_step=8"):
        plan.with_world_size(3)


def test_contract7_slices_and_chapters_are_the_matching_slices_of_the_epoch():
    _, plan = _plan(world_size=2, n=2000)
    for s in (0, 3, plan.num_steps - 1):
        tail = plan.slice(s)
        for r in range(2):
            assert _rank_rows(tail, r) == _rank_rows(plan, r)[s:]
    bounds = chapter_bounds(step_tokens(plan), max_steps=5)
    for r in range(2):
        whole = _rank_rows(plan, r)
        pieces = []
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            ch = chapter_plan(plan, int(a), int(b))
            assert ch.content_hash == plan.content_hash
            pieces += _rank_rows(ch, r)
        assert pieces == whole


def test_sort_keys_put_each_rank_s_rows_in_plan_order():
    _, plan = _plan(world_size=4)
    keys, rank_rows = plan.sort_keys()
    order = plan.sample_ids[np.argsort(keys)]
    starts = np.concatenate([[0], np.cumsum(rank_rows)])
    for r in range(4):
        assert np.array_equal(order[starts[r] : starts[r + 1]], plan.rank_view(r).sample_ids)


@pytest.mark.parametrize("block_rows", [1, 7, 1000])
def test_delivery_yields_the_planned_packed_rows_for_any_block_layout(block_rows):
    lengths, plan = _plan(world_size=2)
    rng = np.random.default_rng(1)
    tokens = {i: rng.integers(0, 100, int(n)).astype(np.int32) for i, n in enumerate(lengths)}
    view = plan.rank_view(1)
    ids = view.sample_ids
    blocks = [
        pa.table(
            {
                "sample_id": pa.array(ids[lo : lo + block_rows], pa.int64()),
                "input_ids": pa.array(
                    [tokens[int(s)] for s in ids[lo : lo + block_rows]], pa.large_list(pa.int32())
                ),
            }
        )
        for lo in range(0, ids.size, block_rows)
    ]
    got = list(deliver(view, blocks, epoch=1, skip=2))
    assert [mb.step for mb in got] == view.steps[2:].tolist()
    for m, mb in zip(range(2, view.steps.size), got, strict=True):
        a, b = int(view.offsets[m]), int(view.offsets[m + 1])
        rows = view.row_offsets[view.micro_rows[m] : view.micro_rows[m + 1] + 1] - a
        sids = view.sample_ids[a:b]
        vals = np.concatenate([tokens[int(s)] for s in sids])
        want = collate_packed(
            vals, np.concatenate([[0], np.cumsum(lengths[sids])]), rows, row_tokens=256
        )
        assert np.array_equal(mb.sample_ids, sids)
        for k in ("input_ids", "attention_mask", "labels", "position_ids"):
            assert np.array_equal(getattr(mb, k).numpy(), want[k]), k
        assert mb.num_padded_tokens == (rows.size - 1) * 256
