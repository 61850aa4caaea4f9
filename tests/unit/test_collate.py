"""Vectorized collation (contract 2 padding) against a slow, obviously correct reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.collate import IGNORE_INDEX, collate, labels_from_mask, padded_length


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
