"""Metric math: padding efficiency and the bucket-debiased loss."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.core.metrics import (
    BucketLossTracker,
    micro_batch_padded,
    padding_efficiency,
    truncation_counts,
)


def test_padding_efficiency_by_hand():
    lengths = np.array([3, 5, 8, 8, 1])
    offsets = np.array([0, 2, 4, 4, 5])  # [3,5] [8,8] [] [1]
    assert micro_batch_padded(lengths, offsets).tolist() == [10, 16, 0, 1]
    assert padding_efficiency(lengths, offsets) == pytest.approx(25 / 27)
    # rounding to 8 but capped at the bucket edge
    padded = micro_batch_padded(lengths, offsets, multiple=8, cap=np.array([6, 8, 8, 8]))
    assert padded.tolist() == [12, 16, 0, 8]


def _diff_var(x, skip=50):
    return float(np.var(np.diff(np.asarray(x)[skip:])))


def test_debiased_loss_removes_bucket_offsets_under_a_falling_trend():
    rng = np.random.default_rng(0)
    offset = np.linspace(-0.5, 0.8, 8)  # long buckets are systematically harder
    tracker = BucketLossTracker(num_buckets=8)
    b = rng.integers(0, 8, 3000)
    loss = 2 + 3 * np.exp(-np.arange(3000) / 400) + offset[b] + 0.05 * rng.standard_normal(3000)
    debiased = [tracker.update(int(k), float(v)) for k, v in zip(b, loss, strict=True)]
    assert _diff_var(debiased) < 0.05 * _diff_var(loss)
    # the per-bucket running losses keep the offsets' order and spread
    est = tracker.bucket_mean
    assert np.all(np.diff(est) > 0)
    assert est[-1] - est[0] == pytest.approx(1.3, abs=0.15)


def test_debiasing_adds_little_noise_when_buckets_do_not_differ():
    rng = np.random.default_rng(1)
    b = rng.integers(0, 6, 100)
    loss = 2 + 3 * np.exp(-np.arange(100) / 30) + 0.05 * rng.standard_normal(100)
    tracker = BucketLossTracker(num_buckets=6)
    debiased = [tracker.update(int(k), float(v)) for k, v in zip(b, loss, strict=True)]
    assert _diff_var(debiased, skip=10) < 4 * _diff_var(loss, skip=10)


def test_unseen_bucket_has_no_offset_and_nan_running_loss():
    t = BucketLossTracker(3)
    assert t.update(0, 5.0) == 5.0
    assert np.isnan(t.bucket_mean[2]) and t.offsets()[2] == 0.0


def test_tracker_state_round_trips():
    t = BucketLossTracker(4)
    for k, loss in [(0, 2.0), (3, 5.0), (0, 1.0)]:
        t.update(k, loss)
    u = BucketLossTracker(4)
    u.load_state_dict(t.state_dict())
    assert u.update(3, 4.0) == t.update(3, 4.0)


def test_batch_recomposition_by_hand():
    from pipeline.core.metrics import batch_recomposition

    ids_a, off_a = np.array([0, 1, 2, 3, 4, 5]), np.array([0, 2, 4, 6])  # {0,1} {2,3} {4,5}
    ids_b, off_b = np.array([0, 2, 1, 3, 4, 5]), np.array([0, 2, 3, 6])  # {0,2} {1} {3,4,5}
    assert batch_recomposition(ids_a, off_a, ids_b, off_b) == pytest.approx(1 / 3)
    assert batch_recomposition(ids_a, off_a, ids_a, off_a) == 1.0
    # a missing sample never pairs
    assert batch_recomposition(ids_a, off_a, np.array([9, 8]), np.array([0, 2])) == 0.0


def test_switch_rate_matches_independent_draws_for_a_shuffle():
    from pipeline.core.metrics import switch_rate

    seq = np.random.default_rng(0).permutation(np.repeat([0, 1, 2], [5000, 3000, 2000]))
    obs, exp = switch_rate(seq)
    assert exp == pytest.approx(1 - (0.25 + 0.09 + 0.04))
    assert abs(obs - exp) < 0.02
    assert switch_rate(np.sort(seq))[0] < 0.001


def test_truncation_counts_by_hand():
    got = truncation_counts(np.array([10, 64, 65, 200]), top=64)
    assert got == {"truncated_samples": 2, "truncated_tokens": 1 + 136, "tokens": 339}
    assert truncation_counts(np.array([1, 2]), top=64)["truncated_samples"] == 0
