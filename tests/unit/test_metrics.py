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


def _debias(tracker, buckets, loss):
    return [tracker.update(int(k), float(v)) for k, v in zip(buckets, loss, strict=True)]


def test_debiased_loss_removes_bucket_offsets_under_a_falling_trend():
    rng = np.random.default_rng(0)
    offset = np.linspace(-0.5, 0.8, 8)  # long buckets are systematically harder
    tracker = BucketLossTracker(num_buckets=8)
    b = rng.integers(0, 8, 3000)
    loss = 2 + 3 * np.exp(-np.arange(3000) / 400) + offset[b] + 0.05 * rng.standard_normal(3000)
    debiased = _debias(tracker, b, loss)
    assert _diff_var(debiased) < 0.05 * _diff_var(loss)
    # the per-bucket running losses keep the offsets' order and spread
    est = tracker.bucket_mean
    assert np.all(np.diff(est) > 0)
    assert est[-1] - est[0] == pytest.approx(1.3, abs=0.15)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_offsets_that_do_not_follow_length_are_learnt_too(seed):
    rng = np.random.default_rng(seed)
    offset = rng.permutation(np.linspace(-0.5, 0.8, 8))  # no order by bucket
    tracker = BucketLossTracker(num_buckets=8)
    b = rng.integers(0, 8, 3000)
    loss = 2 + 3 * np.exp(-np.arange(3000) / 400) + offset[b] + 0.05 * rng.standard_normal(3000)
    assert _diff_var(_debias(tracker, b, loss)) < 0.05 * _diff_var(loss)
    est = tracker.bucket_mean
    np.testing.assert_allclose(est - est.mean(), offset - offset.mean(), atol=0.08)


def _early_training(seed: int, n: int = 300, k: int = 19):
    """Like a short real-text run: offsets in length order that grow from 0 as the model learns,
    step noise of the offsets' size, and one bucket (the truncated longest) taking half the
    steps."""
    rng = np.random.default_rng(seed)
    p = np.r_[np.full(k - 1, 0.5 / (k - 1)), 0.5]
    b = rng.choice(k, n, p=p)
    grown = (1 - np.exp(-np.arange(n) / 100)) * np.linspace(-0.25, 0.1, k)[b]
    loss = 2.3 + 3 * np.exp(-np.arange(n) / 25) + grown + 0.06 * rng.standard_normal(n)
    return b, loss


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_offsets_that_grow_during_a_short_run_are_followed(seed):
    b, loss = _early_training(seed)
    debiased = _debias(BucketLossTracker(19), b, loss)
    assert _diff_var(debiased, skip=75) < 0.4 * _diff_var(loss, skip=75)


def test_debiasing_adds_little_noise_when_buckets_do_not_differ():
    ratios = []
    for seed in range(4):
        rng = np.random.default_rng(seed)
        b = rng.integers(0, 6, 100)
        loss = 2 + 3 * np.exp(-np.arange(100) / 30) + 0.05 * rng.standard_normal(100)
        debiased = _debias(BucketLossTracker(num_buckets=6), b, loss)
        ratios.append(_diff_var(debiased, skip=25) / _diff_var(loss, skip=25))
    assert np.mean(ratios) < 1.2


def test_the_debiased_loss_uses_only_earlier_steps():
    rng = np.random.default_rng(3)
    b, loss = rng.integers(0, 5, 60), rng.normal(3, 0.3, 60)
    t, u = BucketLossTracker(5), BucketLossTracker(5)
    _debias(t, b, loss)
    _debias(u, b, loss)
    # the same history, another loss now: the offset removed does not move with it
    assert t.update(2, 3.0) - u.update(2, 7.5) == pytest.approx(3.0 - 7.5, abs=1e-12)


def test_unseen_bucket_has_no_offset_and_nan_running_loss():
    t = BucketLossTracker(3)
    assert t.update(0, 5.0) == 5.0
    assert np.isnan(t.bucket_mean[2]) and t.offsets()[2] == 0.0


def test_tracker_state_round_trips():
    rng = np.random.default_rng(4)
    t = BucketLossTracker(4)
    _debias(t, rng.integers(0, 4, 80), rng.normal(3, 0.3, 80))
    u = BucketLossTracker(4)
    u.load_state_dict(t.state_dict())
    b, loss = rng.integers(0, 4, 40), rng.normal(3, 0.3, 40)
    assert _debias(u, b, loss) == _debias(t, b, loss)
    assert u.state_dict() == t.state_dict()
    # a checkpoint written by the earlier running-mean tracker still loads; its window refills
    old = {"sums": [0.1] * 4, "counts": [3.0] * 4, "level": 2.0, "decay": 0.9, "prior_visits": 8}
    v = BucketLossTracker(4)
    v.load_state_dict(old)
    assert v.update(1, 2.5) == 2.5 and v.counts.tolist() == [3.0, 4.0, 3.0, 3.0]


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
