"""The jumpiness taken apart: each share of the step-to-step variance against series whose parts
are known, and the two known answers (one length: no composition; no trend: no schedule)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.core.jumpiness import decompose_steps


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
