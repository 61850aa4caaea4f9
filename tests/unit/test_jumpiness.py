"""The jumpiness taken apart: each share of the step-to-step variance against series whose parts
are known, and the two known answers (one length: no composition; no trend: no schedule)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.core.jumpiness import Jumpiness, decompose_steps, sampling_variance


def _truth(y: np.ndarray, trend: np.ndarray, comp: np.ndarray) -> dict[str, float]:
    """The sequential shares with the true parts, over the analysed steps (the last 3/4)."""
    s = slice(y.size // 4, None)
    v0 = np.var(np.diff(y[s]))
    v1 = np.var(np.diff((y - trend)[s]))
    v2 = np.var(np.diff((y - trend - comp)[s]))
    return {"schedule": (v0 - v1) / v0, "composition": (v1 - v2) / v0, "rest": v2 / v0}


def _bucketed(seed: int, T: int = 300, offset: float = 0.3, noise: float = 0.05, fall=60.0):
    """Steps of random buckets whose offsets grow from 0 as training goes on."""
    rng = np.random.default_rng(seed)
    s = np.arange(T)
    trend = 2.0 + 2.0 * np.exp(-s / fall)
    b = rng.integers(0, 8, T)
    comp = offset * (b - 3.5) / 3.5 * (1 - np.exp(-s / 50))
    y = trend + comp + rng.normal(0, noise, T)
    return y, b, trend, comp


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("offset", "noise"), [(0.3, 0.05), (0.1, 0.05), (0.3, 0.2)])
def test_bucket_offsets_are_found_in_their_true_share(seed, offset, noise):
    y, b, trend, comp = _bucketed(seed, offset=offset, noise=noise)
    j = decompose_steps(y, b)
    want = _truth(y, trend, comp)
    assert j.groups == "buckets" and j.steps == 225
    assert abs(j.composition - want["composition"]) < 0.06, (j, want)
    assert abs(j.rest - want["rest"]) < 0.06, (j, want)
    assert j.schedule + j.composition + j.rest == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(4))
def test_buckets_that_do_not_differ_get_no_composition(seed):
    y, b, _, _ = _bucketed(seed, offset=0.0)
    j = decompose_steps(y, b)
    assert abs(j.composition) < 0.05, j


@pytest.mark.parametrize("seed", range(3))
def test_one_length_has_no_composition_effect(seed):
    y, _, _, _ = _bucketed(seed, offset=0.0)
    j = decompose_steps(y, np.zeros(y.size, int))
    assert j.composition == 0.0 and j.groups == "none"
    rng = np.random.default_rng(seed)
    tok = rng.integers(1000, 5000, (y.size, 1)).astype(float)
    j = decompose_steps(y, np.zeros(y.size, int), y[:, None] * tok, tok)
    assert j.composition == 0.0


@pytest.mark.parametrize("seed", range(4))
def test_no_trend_means_no_schedule_effect(seed):
    """A constant learning rate on a plateau: the level does not move."""
    y, b, _, _ = _bucketed(seed, fall=1e-9)  # the trend is flat from the first step
    j = decompose_steps(y, b)
    assert abs(j.schedule) < 0.05, j
    assert j.composition > 0.5


def test_a_steep_smooth_trend_is_the_schedules():
    T = 200
    s = np.arange(T)
    trend = 3.0 - 1.5 * (s / T) ** 2  # a decay that speeds up: steps of unequal size
    y = trend + np.random.default_rng(0).normal(0, 1e-4, T)
    j = decompose_steps(y, np.zeros(T, int))
    assert j.schedule > 0.9, j


@pytest.mark.parametrize("seed", range(3))
def test_a_packed_steps_length_mix_is_its_composition(seed):
    """Four length ranges of different loss; each step's mix of their tokens varies."""
    rng = np.random.default_rng(seed)
    T, R = 300, 4
    s = np.arange(T)
    trend = 2.0 + 2.0 * np.exp(-s / 60)
    tok = rng.integers(1000, 6000, (T, R)).astype(float)
    share = tok / tok.sum(1, keepdims=True)
    offsets = np.array([0.4, 0.1, -0.1, -0.2])
    per = trend[:, None] + offsets + rng.normal(0, 0.05, (T, R))
    y = (per * share).sum(1)
    comp = ((share - share[T // 4 :].mean(0)) * offsets).sum(1)
    j = decompose_steps(y, np.zeros(T, int), per * tok, tok)
    want = _truth(y, trend, comp)
    assert j.groups == "length ranges"
    assert abs(j.composition - want["composition"]) < 0.06, (j, want)


def test_too_few_steps_say_so():
    j = decompose_steps(np.linspace(3, 2, 10), np.zeros(10, int))
    assert not np.isfinite(j.variance) and "too few" in j.lines()[0]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("offset", "noise"), [(0.3, 0.05), (0.1, 0.05), (0.0, 0.05), (0.3, 0.2)])
def test_a_short_run_never_overstates_the_composition(seed, offset, noise):
    y, b, trend, comp = _bucketed(seed, T=90, offset=offset, noise=noise)
    j = decompose_steps(y, b)
    assert j.composition - _truth(y, trend, comp)["composition"] < 0.05, j


def _drawn(seed: int, shock: float, T: int = 400, docs: int = 24):
    """Steps of random buckets, each the token-weighted mean of `docs` documents drawn at
    random (lengths 20-200; each a document effect plus token noise), every step moved by a
    common `shock` the draw does not explain (what the optimiser's own steps would add). Returns
    the step losses, buckets, [T, 6, 1] document sums, and the noise the draw put in."""
    rng = np.random.default_rng(seed)
    s = np.arange(T)
    trend = 2.0 + np.exp(-s / 80)
    b = rng.integers(0, 4, T)
    offset = 0.25 * (b - 1.5) / 1.5
    eps = rng.normal(0, shock, T)
    n = rng.integers(20, 200, (T, docs)).astype(float)
    mean = (trend + offset + eps)[:, None]
    S = n * (mean + rng.normal(0, 0.3, (T, docs))) + np.sqrt(n) * rng.normal(0, 1.0, (T, docs))
    y = S.sum(1) / n.sum(1)
    stats = np.stack([S.sum(1), n.sum(1), np.full(T, docs), (S * S).sum(1), (S * n).sum(1),
                      (n * n).sum(1)], axis=1)[:, :, None]  # fmt: skip
    return y, b, stats, y - mean[:, 0], eps


def _diff_share(part: np.ndarray, y: np.ndarray) -> float:
    s = slice(y.size // 4, None)
    return float(np.var(np.diff(part[s])) / np.var(np.diff(y[s])))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shock", [0.0, 0.03])
def test_sampling_noise_is_the_draws_share_and_the_rest_what_it_does_not_explain(seed, shock):
    """Known answer: the draw of documents puts a known noise in each step; its share is found
    from the steps' own document sums, and what is left is the shock the draw does not explain
    (none without one)."""
    y, b, stats, drawn, eps = _drawn(seed, shock)
    j = decompose_steps(y, b, noise=sampling_variance(stats))
    assert abs(j.noise - _diff_share(drawn, y)) < 0.06, j
    assert abs(j.rest - _diff_share(eps, y)) < 0.06, j
    assert j.composition > 0.2 and j.explained == pytest.approx(1.0 - j.rest)
    assert j.schedule + j.composition + j.noise + j.rest == pytest.approx(1.0)
    assert "sampling noise" in " ".join(j.lines())


def _group_sums(S: np.ndarray, n: np.ndarray) -> list[float]:
    return [S.sum(), n.sum(), S.size, (S * S).sum(), (S * n).sum(), (n * n).sum()]


def test_sampling_variance_counts_only_the_spread_within_each_range():
    """Documents that differ only between ranges add no sampling noise; a range of one
    document adds none (its spread is unknown); two that differ add the ratio estimator's."""
    docs = np.zeros((2, 6, 2))
    single = np.array([3.0 * 40]), np.array([40.0])  # range 1: one document, loss 3.0 a token
    alike = np.array([2.0 * 10, 2.0 * 30]), np.array([10.0, 30.0])  # range 0: 2.0 a token
    differ = np.array([2.0 * 10 + 20, 2.0 * 30 - 20]), np.array([10.0, 30.0])
    docs[0, :, 0], docs[0, :, 1] = _group_sums(*alike), _group_sums(*single)
    docs[1, :, 0], docs[1, :, 1] = _group_sums(*differ), _group_sums(*single)
    S, m = differ
    want = 2 / 1 * ((S - S.sum() / m.sum() * m) ** 2).sum() / (m.sum() + 40.0) ** 2
    got = sampling_variance(docs)
    assert got[0] == pytest.approx(0.0, abs=1e-12)
    assert got[1] == pytest.approx(want) and want > 0


def test_a_run_without_recorded_noise_reads_as_before():
    y, b, _, _ = _bucketed(0)
    j = decompose_steps(y, b)
    assert np.isnan(j.noise) and j.explained == pytest.approx(j.schedule + j.composition)
    assert "sampling noise" not in " ".join(j.lines())


def test_parts_that_add_up_past_the_whole_show_the_noise_as_what_is_left():
    """A short run's estimates can add up to more than 1: the noise is shown as what schedule
    and composition leave, its estimate beside it, and the rest as none."""
    over = Jumpiness(69, 1.0, 0.0, 0.02, -0.22, "length ranges", 1.20)
    assert over.noise_shown == pytest.approx(0.98) and over.explained == pytest.approx(1.22)
    text = " ".join(over.lines())
    assert "100% explained" in text and "98% sampling noise" in text
    assert "estimated at 120% from 69 steps" in text and "no rest" in text
    under = Jumpiness(228, 1.0, 0.0, 0.78, 0.07, "buckets", 0.15)
    assert under.noise_shown == pytest.approx(0.15)
    assert "15% sampling noise (the draw of documents), 7% rest" in " ".join(under.lines())
    assert Jumpiness.from_dict(under.to_dict()) == under
