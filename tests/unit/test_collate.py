"""Vectorized collation (contract 2 padding) against a slow, obviously correct reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.collate import IGNORE_INDEX, collate, labels_from_mask, padded_length
from pipeline.core.metrics import micro_batch_padded


def _reference(rows, masks, upper, multiple, pad_id):
    L = 0
    if rows and max(len(r) for r in rows):
        L = min(-(-max(len(r) for r in rows) // multiple) * multiple, upper)
    ids = [[pad_id] * L for _ in rows]
    att = [[0] * L for _ in rows]
    lab = [[IGNORE_INDEX] * L for _ in rows]
    pos = [[0] * L for _ in rows]
    for b, r in enumerate(rows):
        for i, t in enumerate(r):
            ids[b][i] = t
            att[b][i] = 1
            pos[b][i] = i
            if masks is None or masks[b][i]:
                lab[b][i] = t
    return ids, att, lab, pos


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 999), min_size=1, max_size=40), min_size=0, max_size=8),
    st.sampled_from([1, 8, 16]),
    st.booleans(),
    st.data(),
)
def test_contract2_collate_matches_reference(rows, multiple, use_mask, data):
    upper = max([len(r) for r in rows], default=1) + data.draw(st.integers(0, 20))
    masks = (
        [data.draw(st.lists(st.booleans(), min_size=len(r), max_size=len(r))) for r in rows]
        if use_mask
        else None
    )
    values = np.array([t for r in rows for t in r], dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    mask_flat = np.array([m for ms in masks for m in ms], dtype=np.int8) if use_mask else None
    out = collate(
        values, offsets, upper=upper, pad_to_multiple_of=multiple, pad_id=7, loss_mask=mask_flat
    )
    ids, att, lab, pos = _reference(rows, masks, upper, multiple, 7)
    assert out["input_ids"].tolist() == ids
    assert out["attention_mask"].tolist() == att
    assert out["labels"].tolist() == lab
    assert out["position_ids"].tolist() == pos
    assert out["num_real_tokens"] == len(values)
    assert out["input_ids"].shape[1] <= upper


def test_contract2_padded_length_rounds_up_but_never_past_upper_edge():
    assert padded_length(761, 770, 8) == 768
    assert padded_length(769, 770, 8) == 770
    assert padded_length(770, 770, 8) == 770
    with pytest.raises(ValueError, match="exceeds its bucket's upper edge"):
        padded_length(771, 770, 8)


def test_contract2_the_padding_metric_counts_what_collate_pads():
    """One padded-length rule: element-wise over micro-batches it is what the planned padding
    metric counts, and each micro-batch's collated width."""
    rng = np.random.default_rng(0)
    upper = np.array([40, 64, 64, 100])
    lens = np.concatenate([rng.integers(1, u + 1, 5) for u in upper])
    offsets = np.arange(0, lens.size + 1, 5)
    longest = lens.reshape(4, 5).max(axis=1)
    widths = padded_length(longest, upper, 8)
    by_hand = [min(-(-int(m) // 8) * 8, int(u)) for m, u in zip(longest, upper, strict=True)]
    assert widths.tolist() == by_hand
    assert (
        micro_batch_padded(lens, offsets, multiple=8, cap=upper).tolist() == (5 * widths).tolist()
    )
    for b in range(4):
        row_offsets = np.concatenate([[0], np.cumsum(lens[offsets[b] : offsets[b + 1]])])
        out = collate(np.zeros(row_offsets[-1], np.int32), row_offsets, upper=int(upper[b]))
        assert out["input_ids"].shape == (5, widths[b])
    with pytest.raises(ValueError, match="exceeds its bucket's upper edge"):
        padded_length(np.array([10, 65]), np.array([64, 64]), 8)


def test_contract4_empty_microbatch_collates_to_zero_size():
    out = collate(np.zeros(0, np.int32), np.array([0]), upper=64)
    assert out["input_ids"].shape == (0, 0) and out["num_real_tokens"] == 0


def test_collate_offsets_may_point_into_a_larger_buffer():
    values = np.arange(20, dtype=np.int32)
    out = collate(values, np.array([5, 8, 12]), upper=16, pad_to_multiple_of=4)
    assert out["input_ids"].tolist() == [[5, 6, 7, 0], [8, 9, 10, 11]]


def test_labels_column_is_used_as_given():
    out = collate(
        np.array([1, 2, 3]),
        np.array([0, 3]),
        upper=8,
        labels=np.array([IGNORE_INDEX, 2, 3]),
        pad_to_multiple_of=4,
    )
    assert out["labels"].tolist() == [[IGNORE_INDEX, 2, 3, IGNORE_INDEX]]


def test_labels_from_mask_keeps_supervised_tokens_only():
    vals = np.array([5, 6, 7, 8])
    assert labels_from_mask(vals, np.array([1, 0, 2, 0], np.int8)).tolist() == [
        5,
        IGNORE_INDEX,
        7,
        IGNORE_INDEX,
    ]


def _rowwise_collate(values, offsets, upper, multiple, pad_id, loss_mask=None, labels=None):
    """Straightforward per-row padding (the behaviour collate's vectorized version must match)."""
    offsets = [int(o) for o in offsets]
    spans = list(zip(offsets[:-1], offsets[1:], strict=True))
    B = len(spans)
    longest = max((e - a for a, e in spans), default=0)
    L = min(-(-longest // multiple) * multiple, upper) if longest else 0
    out = {
        "input_ids": np.full((B, L), pad_id, np.int64),
        "attention_mask": np.zeros((B, L), np.int64),
        "labels": np.full((B, L), IGNORE_INDEX, np.int64),
        "position_ids": np.zeros((B, L), np.int64),
    }
    for b, (a, e) in enumerate(spans):
        k = e - a
        out["input_ids"][b, :k] = values[a:e]
        out["attention_mask"][b, :k] = 1
        out["position_ids"][b, :k] = np.arange(k)
        if labels is not None:
            out["labels"][b, :k] = labels[a:e]
        elif loss_mask is not None:
            out["labels"][b, :k] = [
                t if s else IGNORE_INDEX for t, s in zip(values[a:e], loss_mask[a:e], strict=True)
            ]
        else:
            out["labels"][b, :k] = values[a:e]
    out["num_real_tokens"] = np.int64(offsets[-1] - offsets[0])
    out["num_padded_tokens"] = np.int64(B * L)
    return out


def _random_batch(rng):
    B = int(rng.choice([0, 1, 2, 3, 5, 8, 17, 64]))
    shape = rng.choice(["similar", "ragged", "with_empty", "all_empty"])
    if shape == "similar":
        hi = int(rng.integers(1, 300))
        lens = rng.integers(max(0, hi - 20), hi + 1, B)
    elif shape == "ragged":
        lens = rng.integers(0, 200, B)
    elif shape == "with_empty":
        lens = rng.integers(0, 60, B) * rng.integers(0, 2, B)  # about half the rows empty
    else:
        lens = np.zeros(B, np.int64)
    first = int(rng.integers(0, 30)) if rng.random() < 0.5 else 0
    after = int(rng.integers(0, 30))  # the flat buffer may run on past the batch's last row
    offsets = first + np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    dtype = rng.choice([np.int32, np.int64])
    top = 50_000 if dtype == np.int32 else 2**40
    values = rng.integers(0, top, int(offsets[-1]) + after).astype(dtype)
    longest = int(lens.max()) if B else 0
    multiple = int(rng.choice([1, 8]))
    upper = max(longest, 1) + int(rng.choice([0, 0, 3, 50]))
    pad_id = int(rng.choice([0, 7, -1, 50_256]))
    kw = {}
    sup = rng.choice(["none", "loss_mask", "bool_mask", "labels"])
    if sup == "loss_mask":
        kw["loss_mask"] = rng.integers(0, 3, values.size).astype(np.int8)
    elif sup == "bool_mask":
        kw["loss_mask"] = rng.random(values.size) < 0.6
    elif sup == "labels":
        kw["labels"] = np.where(rng.random(values.size) < 0.6, values, IGNORE_INDEX).astype(dtype)
    return values, offsets, dict(upper=upper, pad_to_multiple_of=multiple, pad_id=pad_id, **kw)


@pytest.mark.parametrize("seed", range(8))
def test_collate_is_bit_identical_to_rowwise_padding(seed):
    rng = np.random.default_rng(seed)
    for _ in range(60):
        values, offsets, kw = _random_batch(rng)
        got = collate(values, offsets, **kw)
        want = _rowwise_collate(
            values,
            offsets,
            kw["upper"],
            kw["pad_to_multiple_of"],
            kw["pad_id"],
            kw.get("loss_mask"),
            kw.get("labels"),
        )
        assert list(got) == list(want)
        for key, w in want.items():
            g = got[key]
            assert type(g) is type(w) and g.dtype == w.dtype == np.int64, key
            assert g.shape == w.shape and np.array_equal(g, w), (key, offsets, kw)
            if g.ndim:  # fresh, writable, C-ordered arrays (torch.from_numpy shares them as is)
                assert g.flags.c_contiguous and g.flags.writeable and g.flags.owndata, key


def test_collate_empty_batch_and_all_empty_rows_have_zero_width():
    for offsets, B in (([4], 0), ([4, 4, 4], 2)):
        out = collate(np.arange(9, dtype=np.int64), np.array(offsets), upper=16, pad_id=3)
        for key in ("input_ids", "attention_mask", "labels", "position_ids"):
            assert out[key].shape == (B, 0) and out[key].dtype == np.int64
        assert out["num_real_tokens"] == 0 and out["num_padded_tokens"] == 0


def test_collate_rejects_rows_past_the_upper_edge_short_values_and_decreasing_offsets():
    vals = np.arange(10, dtype=np.int32)
    with pytest.raises(ValueError, match="exceeds its bucket's upper edge"):
        collate(vals, np.array([0, 9]), upper=8)
    with pytest.raises(ValueError):  # offsets claim more tokens than values holds
        collate(vals, np.array([0, 4, 12]), upper=16)
    with pytest.raises(ValueError):  # labels shorter than the tokens
        collate(vals, np.array([0, 4, 8]), upper=16, labels=np.arange(5))
    with pytest.raises(ValueError, match="non-decreasing"):
        collate(vals, np.array([0, 6, 2]), upper=16)
