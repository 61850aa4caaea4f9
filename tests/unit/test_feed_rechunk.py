"""Worker-side re-chunking and padding without Ray: any block layout gives the plan's batches."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.collate import IGNORE_INDEX
from pipeline.core.config import BatchingConfig, PlanConfig
from pipeline.core.plan import epoch_plan
from pipeline.data.rechunk import deliver

EDGES = [0, 8, 24, 64]


def _corpus(n: int, seed: int):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 65, n)
    ids = rng.permutation(10 * n)[:n].astype(np.int64)
    tokens = {
        int(i): rng.integers(0, 100, int(k)).astype(np.int32)
        for i, k in zip(ids, lengths, strict=True)
    }
    masks = {i: (rng.random(t.size) < 0.7).astype(np.int8) for i, t in tokens.items()}
    return ids, lengths, tokens, masks


def _blocks(sample_ids, tokens, masks, cuts, with_mask):
    out = []
    for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
        sids = sample_ids[lo:hi]
        cols = {
            "key": pa.array(np.arange(lo, hi), pa.int64()),
            "sample_id": pa.array(sids, pa.int64()),
            "input_ids": pa.array([tokens[int(s)] for s in sids], pa.large_list(pa.int32())),
        }
        if with_mask:
            cols["sup"] = pa.array([masks[int(s)] for s in sids], pa.large_list(pa.int8()))
        out.append(pa.table(cols))
    return out


def _slow_reference(rows, upper, multiple, masks=None):
    """Per-token Python padding: the independent reference."""
    B = len(rows)
    maxlen = max((len(r) for r in rows), default=0)
    L = min(-(-maxlen // multiple) * multiple, upper) if B else 0
    ids = [[0] * L for _ in range(B)]
    att = [[0] * L for _ in range(B)]
    lab = [[IGNORE_INDEX] * L for _ in range(B)]
    pos = [[0] * L for _ in range(B)]
    for b, r in enumerate(rows):
        for j, tok in enumerate(r):
            ids[b][j], att[b][j], pos[b][j] = int(tok), 1, j
            if masks is None or masks[b][j]:
                lab[b][j] = int(tok)
    return {
        k: np.array(v, dtype=np.int64).reshape(B, L)
        for k, v in {
            "input_ids": ids,
            "attention_mask": att,
            "labels": lab,
            "position_ids": pos,
        }.items()
    }


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 120),
    world=st.integers(1, 3),
    seed=st.integers(0, 2**16),
    with_mask=st.booleans(),
    data=st.data(),
)
def test_contract2_padding_matches_slow_reference_for_any_block_layout(
    n, world, seed, with_mask, data
):
    ids, lengths, tokens, masks = _corpus(n, seed)
    plan = epoch_plan(
        lengths,
        EDGES,
        epoch=0,
        world_size=world,
        batching=BatchingConfig(token_budget=256),
        sample_ids=ids,
        plan=PlanConfig(seed=seed),
    )
    for rank in range(world):
        view = plan.rank_view(rank)
        total = int(view.offsets[-1])
        k = data.draw(st.integers(0, min(total, 6)))
        cuts = np.unique(
            np.concatenate(
                [[0, total], data.draw(st.lists(st.integers(0, total), min_size=k, max_size=k))]
            )
        ).astype(int)
        blocks = _blocks(view.sample_ids, tokens, masks, cuts, with_mask)
        got = list(deliver(view, blocks, epoch=0, supervision="loss_mask" if with_mask else ""))
        assert len(got) == plan.num_steps
        for m, mb in enumerate(got):
            want_ids = view.sample_ids[view.offsets[m] : view.offsets[m + 1]]
            assert np.array_equal(mb.sample_ids, want_ids)
            assert mb.step == view.steps[m] and mb.bucket == view.buckets[m]
            ref = _slow_reference(
                [tokens[int(s)] for s in want_ids],
                EDGES[mb.bucket + 1],
                8,
                [masks[int(s)] for s in want_ids] if with_mask else None,
            )
            for key, arr in ref.items():
                t = getattr(mb, key)
                assert t.shape == arr.shape, key
                assert np.array_equal(t.numpy(), arr), key
            assert mb.num_real_tokens == int(lengths[np.isin(ids, want_ids)].sum())
            assert mb.num_padded_tokens == arr.size


def test_contract4_empty_micro_batch_is_zero_by_zero():
    ids, lengths, tokens, masks = _corpus(5, 0)
    plan = epoch_plan(
        lengths,
        EDGES,
        epoch=0,
        world_size=8,
        batching=BatchingConfig(mode="fixed", batch_size=5),
        sample_ids=ids,
    )
    view = plan.rank_view(7)
    got = list(
        deliver(
            view,
            _blocks(view.sample_ids, tokens, masks, [0, view.offsets[-1]], False),
            epoch=0,
        )
    )
    assert len(got) == plan.num_steps
    assert all(mb.input_ids.shape == (0, 0) and mb.num_real_tokens == 0 for mb in got)


def _single_rank_view(ids, lengths):
    plan = epoch_plan(
        lengths,
        EDGES,
        epoch=0,
        world_size=1,
        batching=BatchingConfig(token_budget=128),
        sample_ids=ids,
    )
    return plan.rank_view(0)


def test_stream_out_of_plan_order_raises_naming_rank_step_and_ids():
    ids, lengths, tokens, masks = _corpus(40, 3)
    view = _single_rank_view(ids, lengths)
    swapped = view.sample_ids.copy()
    swapped[[3, 4]] = swapped[[4, 3]]
    blocks = _blocks(swapped, tokens, masks, [0, swapped.size], False)
    with pytest.raises(RuntimeError, match=r"rank 0 epoch 0 step \d+: delivered sample_id"):
        list(deliver(view, blocks, epoch=0))


def test_stream_shorter_than_plan_raises():
    ids, lengths, tokens, masks = _corpus(40, 4)
    view = _single_rank_view(ids, lengths)
    blocks = _blocks(view.sample_ids, tokens, masks, [0, 10], False)
    with pytest.raises(RuntimeError, match="ended after 10 of 40 planned rows"):
        list(deliver(view, blocks, epoch=0))


@pytest.mark.parametrize("skip", [0, 1, 5, 11])
def test_contract7_skipping_micro_batches_continues_an_interrupted_stream(skip):
    ids, lengths, tokens, masks = _corpus(60, 5)
    view = _single_rank_view(ids, lengths)
    total = int(view.offsets[-1])
    blocks = _blocks(view.sample_ids, tokens, masks, [0, 7, 20, 33, total], False)
    full = list(deliver(view, blocks, epoch=0))
    rest = list(deliver(view, blocks, epoch=0, skip=skip))
    assert len(rest) == len(full) - skip
    for a, b in zip(full[skip:], rest, strict=True):
        assert a.step == b.step and np.array_equal(a.sample_ids, b.sample_ids)
        assert (a.input_ids == b.input_ids).all() and (a.labels == b.labels).all()


def test_skipped_rows_are_still_checked_against_the_plan():
    ids, lengths, tokens, masks = _corpus(40, 6)
    view = _single_rank_view(ids, lengths)
    swapped = view.sample_ids.copy()
    swapped[[0, 1]] = swapped[[1, 0]]
    blocks = _blocks(swapped, tokens, masks, [0, 20, swapped.size], False)
    with pytest.raises(RuntimeError, match="delivered sample_id"):
        list(deliver(view, blocks, epoch=0, skip=3))


def test_delivering_sets_the_allocator_to_keep_freed_memory():
    """The padding stream sets keep_freed_memory (tests/unit/test_delivery_costs.py measures
    what it saves) before its first micro-batch."""
    from pipeline.data import rechunk

    rechunk.keep_freed_memory.cache_clear()
    ids, lengths, tokens, masks = _corpus(20, 7)
    view = _single_rank_view(ids, lengths)
    blocks = _blocks(view.sample_ids, tokens, masks, [0, view.offsets[-1]], False)
    next(deliver(view, blocks, epoch=0))
    assert rechunk.keep_freed_memory.cache_info().currsize == 1
