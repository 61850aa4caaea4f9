"""Metric math: padding efficiency and the bucket-debiased loss."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.metrics import BucketLossTracker, micro_batch_padded, padding_efficiency


def test_padding_efficiency_by_hand():
    lengths = np.array([3, 5, 8, 8, 1])
    offsets = np.array([0, 2, 4, 4, 5])  # [3,5] [8,8] [] [1]
    assert micro_batch_padded(lengths, offsets).tolist() == [10, 16, 0, 1]
    assert padding_efficiency(lengths, offsets) == pytest.approx(25 / 27)
    # rounding to 8 but capped at the bucket edge
    padded = micro_batch_padded(lengths, offsets, multiple=8, cap=np.array([6, 8, 8, 8]))
    assert padded.tolist() == [12, 16, 0, 8]


def test_debiased_loss_removes_a_constant_bucket_offset():
    rng = np.random.default_rng(0)
    tracker = BucketLossTracker(num_buckets=3, decay=0.9)
    offset = np.array([0.0, 1.0, 2.5])  # long buckets are systematically harder
    raw, debiased = [], []
    for _ in range(2000):
        k = int(rng.integers(3))
        loss = 3.0 + offset[k] + 0.01 * rng.standard_normal()
        raw.append(loss)
        debiased.append(tracker.update(k, loss))
    tail_raw, tail_deb = np.var(raw[500:]), np.var(debiased[500:])
    assert tail_deb < 0.05 * tail_raw
    assert tracker.bucket_mean[2] - tracker.bucket_mean[0] == pytest.approx(2.5, abs=0.05)


def test_tracker_state_round_trips():
    t = BucketLossTracker(4)
    for k, loss in [(0, 2.0), (3, 5.0), (0, 1.0)]:
        t.update(k, loss)
    u = BucketLossTracker(4)
    u.load_state_dict(t.state_dict())
    assert u.update(3, 4.0) == t.update(3, 4.0)


def test_batch_recomposition_by_hand():
    from pipeline.metrics import batch_recomposition

    ids_a, off_a = np.array([0, 1, 2, 3, 4, 5]), np.array([0, 2, 4, 6])  # {0,1} {2,3} {4,5}
    ids_b, off_b = np.array([0, 2, 1, 3, 4, 5]), np.array([0, 2, 3, 6])  # {0,2} {1} {3,4,5}
    assert batch_recomposition(ids_a, off_a, ids_b, off_b) == pytest.approx(1 / 3)
    assert batch_recomposition(ids_a, off_a, ids_a, off_a) == 1.0
    # a missing sample never pairs
    assert batch_recomposition(ids_a, off_a, np.array([9, 8]), np.array([0, 2])) == 0.0


def test_switch_rate_matches_independent_draws_for_a_shuffle():
    from pipeline.metrics import switch_rate

    seq = np.random.default_rng(0).permutation(np.repeat([0, 1, 2], [5000, 3000, 2000]))
    obs, exp = switch_rate(seq)
    assert exp == pytest.approx(1 - (0.25 + 0.09 + 0.04))
    assert abs(obs - exp) < 0.02
    assert switch_rate(np.sort(seq))[0] < 0.001
