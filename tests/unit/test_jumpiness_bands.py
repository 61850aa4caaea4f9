"""The jumpiness reading's bands: each share's 90% band, from the run's own steps resampled,
against how much the reading actually moves from run to run of one process."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.core.jumpiness import Jumpiness, decompose_steps, sampling_variance
from tests.unit.test_jumpiness import _bucketed, _drawn, _truth

Z90 = 1.645  # a 90% band is this many standard deviations each side


@pytest.mark.parametrize("T", [300, 1000])
@pytest.mark.parametrize(("offset", "noise"), [(0.3, 0.05), (0.1, 0.05), (0.3, 0.2)])
def test_jumpiness_bands_are_the_spread_of_the_reading_over_runs(T, offset, noise):
    """40 runs of one process: the band's half-width is the run-to-run spread of the
    composition share (within a factor of 1.6), and the band of most runs holds the process's
    share (its mean over the runs' true shares)."""
    runs = [_bucketed(seed, T=T, offset=offset, noise=noise) for seed in range(40)]
    readings = [decompose_steps(y, b) for y, b, _, _ in runs]
    share = np.array([j.composition for j in readings])
    half = np.array([j.band("composition") for j in readings])
    process = np.mean([_truth(y, trend, comp)["composition"] for y, _, trend, comp in runs])
    assert 1 / 1.6 < half.mean() / Z90 / share.std() < 1.6, (half.mean(), share.std())
    assert np.mean(np.abs(share - process) <= half) >= 0.75


def test_jumpiness_bands_narrow_as_the_run_grows():
    def width(T: int) -> float:
        runs = [_bucketed(seed, T=T, offset=0.1) for seed in range(10)]
        return float(np.mean([decompose_steps(y, b).band("composition") for y, b, _, _ in runs]))

    assert width(1200) < 0.7 * width(300)  # about 1/sqrt(steps): half as wide at 4x the steps


def test_jumpiness_bands_are_deterministic_and_kept_with_the_reading():
    y, b, _, _ = _bucketed(0)
    j = decompose_steps(y, b)
    assert repr(j) == repr(decompose_steps(y, b))  # repr: NaN == NaN
    assert set(j.bands) == {"schedule", "composition", "noise", "rest"}
    assert np.isnan(j.band("noise")), "no recorded noise, no band for it"
    assert repr(Jumpiness.from_dict(json.loads(json.dumps(j.to_dict())))) == repr(j)
    text = " ".join(j.lines())
    assert "90% bands" in text
    assert f"{100 * j.composition:.0f}±{100 * j.band('composition'):.0f}% composition" in text


def test_a_reading_written_before_the_bands_reads_without_them():
    old = {k: v for k, v in decompose_steps(*_bucketed(0)[:2]).to_dict().items() if k != "bands"}
    j = Jumpiness.from_dict(old)
    assert j.bands == {} and np.isnan(j.band("composition"))
    assert "±" not in " ".join(j.lines()) and "bands" not in " ".join(j.lines())


@pytest.mark.parametrize("seed", range(3))
def test_the_sampling_noise_has_a_band_where_the_run_recorded_it(seed):
    y, b, stats, _, _ = _drawn(seed, 0.0)
    j = decompose_steps(y, b, noise=sampling_variance(stats))
    assert 0 < j.band("noise") < 0.2 and 0 < j.band("composition") < 0.2
    assert f"±{100 * j.band('noise'):.0f}% sampling noise" in " ".join(j.lines())


def test_a_noise_cut_to_what_is_left_has_its_band_beside_its_estimate():
    over = Jumpiness(69, 1.0, 0.0, 0.02, -0.22, "length ranges", 1.20, {"noise": 0.35})
    text = " ".join(over.lines())
    assert "98% sampling noise" in text and "estimated at 120±35% from 69 steps" in text
    assert np.isnan(over.band_shown("noise")) and over.band("noise") == 0.35


def test_bands_are_the_same_computed_a_few_resamplings_at_a_time(monkeypatch):
    """Long runs resample in passes (bounded memory); the bands do not depend on the passes."""
    import pipeline.core.jumpiness as jumpiness

    y, b, _, _ = _bucketed(1)
    whole = decompose_steps(y, b).bands
    monkeypatch.setattr(jumpiness, "BAND_CHUNK", 3 * y.size)  # a handful of resamplings a pass
    assert repr(decompose_steps(y, b).bands) == repr(whole)  # repr: NaN == NaN
