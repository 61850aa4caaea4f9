"""Why a training loss is jumpy: its step-to-step variance taken apart (pure numpy).

The step loss is modelled as

    loss_t = trend_t + composition_t + rest_t

- trend: a smooth curve through the run (a cubic in the step, fitted by least squares), what the
  learning-rate schedule and learning itself move slowly;
- composition: what the step's mix of lengths adds. Each group (the step's bucket, or for
  packed rows each document length range) has an offset from the trend, estimated near the step
  from the group's other steps (a window of steps, the step itself left out, so the estimate
  never absorbs the step's own noise) and shrunk towards 0 by the share of it that is noise;
  the step's composition is its groups' offsets weighted by
  their share of its tokens, centred on the run's average mix. A bucketed step is one group; a
  packed step holds every range, and only the deviation of its mix from the average counts;
- noise: what the step's draw of documents moves, where the run recorded it: each step's
  sampling variance, from its documents' spread around their length range's mean loss
  (`sampling_variance`); independent from step to step, it adds the two steps' variances to
  each step-to-step change;
- rest: what none of these explains (the optimiser's own steps, data quirks, and all of the
  noise where the run recorded no sampling variance).

Variances are of first differences (step to step), as `metrics.readability_ratio` measures
them, after the first quarter of the run (warm-up and the steepest fall, where no offset is
known yet). The shares are sequential: the schedule's is the variance the trend's removal
removes, the composition's what removing the composition then removes, the rest what is left;
the noise's share is its expected variance, and the rest what is left; they add up to 1. A part
can come out slightly negative where removing it adds noise: that reads as "none". On short runs (tens of steps per bucket) the composition's share is
understated, never overstated: its offsets are shrunk (tests/unit/test_jumpiness.py).

Each share carries a band (`_bands`, printed "34±6%"): a 90% interval from the step-to-step
changes resampled in blocks, as wide as the share moves between runs of one process at a few
hundred steps or more (tests/unit/test_jumpiness_bands.py); narrower than that on runs of a
hundred steps, where the fitted trend and offsets add uncertainty the resampling holds fixed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

import numpy as np

from pipeline.core.orders import JUMPINESS_BAND_STREAM

__all__ = ["Jumpiness", "decompose", "decompose_steps", "sampling_variance", "share_percent"]

TREND_DEGREE = 3  # of the trend's polynomial in the step: smooth over a run's remaining steps
MIN_STEPS = 12  # analysed steps below which nothing is said
BAND = 0.9  # the bands' coverage: from the 5th to the 95th percentile of the resampled shares
BAND_DRAWS = 400  # resamplings of the step-to-step changes
BAND_CHUNK = 2**20  # resampled changes per pass, of each of the three series


@dataclass(frozen=True)
class Jumpiness:
    """Shares of the step-to-step variance of the training loss (adding up to 1)."""

    steps: int  # steps analysed (after the first quarter)
    variance: float  # of the loss's step-to-step change
    schedule: float
    composition: float
    rest: float
    groups: str  # what composition means here: "buckets", "length ranges" or "none"
    noise: float = float("nan")  # sampling noise; NaN where the run did not record it
    # Per part: half the width of its BAND interval over the run's steps resampled (`_bands`);
    # empty in readings written before the bands, NaN for the noise where it is unknown.
    bands: dict = field(default_factory=dict)

    def band(self, part: str) -> float:
        """`part`'s half-width (a share, like the part), NaN where not known."""
        return float(self.bands.get(part, float("nan")))

    def band_shown(self, part: str) -> float:
        """The band beside a part as shown: none beside a noise cut to what is left (`noise_shown`
        below its estimate), whose band is the estimate's and printed beside that."""
        return float("nan") if part == "noise" and self.rest < 0 else self.band(part)

    @property
    def explained(self) -> float:
        """The share the named causes explain (schedule, composition, and noise where known)."""
        return self.schedule + self.composition + (self.noise if np.isfinite(self.noise) else 0)

    @property
    def noise_shown(self) -> float:
        """The noise's share as drawn and printed: at most what schedule and composition leave
        (each part is an estimate from the run's own steps; on short runs they can add up to
        more than the whole, and the rest is then none)."""
        if not np.isfinite(self.noise):
            return float("nan")
        left = 1.0 - max(self.schedule, 0.0) - max(self.composition, 0.0)
        return float(min(max(self.noise, 0.0), max(left, 0.0)))

    def to_dict(self) -> dict:
        return asdict(self) | {"explained": self.explained}

    @classmethod
    def from_dict(cls, d: dict) -> Jumpiness:
        """The reading `to_dict` wrote (its derived `explained` dropped)."""
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})

    def lines(self) -> list[str]:
        """The reading in a few short lines (console, picture)."""
        if not np.isfinite(self.variance):
            return ["jumpiness: too few steps to take apart"]
        by = {"buckets": "bucket offsets", "length ranges": "length mix"}.get(self.groups)
        comp = f"{self._part_percent('composition')} composition ({by})" if by else "no composition"
        sched, rest = self._part_percent("schedule"), self._part_percent("rest")
        band = f", {int(100 * BAND)}% bands" if self.bands else ""
        if not np.isfinite(self.noise):
            return [
                f"step-to-step loss variance ({self.steps} steps{band}):",
                f"  {comp},",
                f"  {sched} schedule (smooth trend), {rest} rest",
            ]
        shown = share_percent(self.noise_shown, self.band_shown("noise"))
        noise = f"{shown} sampling noise (the draw of documents"
        if self.rest < 0:  # the parts' estimates add up to more than the whole (noise_shown)
            noise += (
                f"; estimated at {self._part_percent('noise')} from {self.steps} steps), no rest"
            )
        else:
            noise += f"), {rest} rest"
        return [
            f"step-to-step loss variance ({self.steps} steps, "
            f"{share_percent(min(self.explained, 1.0))} explained{band}):",
            f"  {comp}, {sched} schedule (smooth trend),",
            f"  {noise}",
        ]

    def _part_percent(self, part: str) -> str:
        return share_percent(getattr(self, part), self.band(part))


def share_percent(x: float, band: float = float("nan")) -> str:
    """A share in percent, with its band's half-width where known: "34±6%"."""
    pm = f"±{100 * band:.0f}" if np.isfinite(band) else ""
    return f"{100 * max(x, 0.0):.0f}{pm}%"


def _trend(y: np.ndarray) -> np.ndarray:
    """Least-squares cubic (at most) in the step, over the steps given."""
    n = y.size
    tau = np.linspace(-1.0, 1.0, n)
    X = np.vander(tau, min(TREND_DEGREE, n - 1) + 1)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    return X @ coef


def _windowed(values: np.ndarray, weights: np.ndarray, half: int):
    """Per step and group: (the weighted mean of `values` over the steps within `half` of it,
    the step itself left out, NaN where no other step of the group is near; their weight)."""
    v = np.where(weights > 0, np.nan_to_num(values) * weights, 0.0)
    cs = np.vstack([np.zeros((1, v.shape[1])), np.cumsum(v, axis=0)])
    cw = np.vstack([np.zeros((1, v.shape[1])), np.cumsum(weights, axis=0)])
    n = v.shape[0]
    lo = np.clip(np.arange(n) - half, 0, n)
    hi = np.clip(np.arange(n) + half + 1, 0, n)
    s, w = cs[hi] - cs[lo] - v, cw[hi] - cw[lo] - weights
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(w > 1e-12, s / np.where(w > 1e-12, w, 1.0), np.nan), w


def _offsets(resid: np.ndarray, weights: np.ndarray, half: int) -> np.ndarray:
    """Each group's offset from the trend near each step: the left-out window mean of its
    residuals, shrunk towards 0 by how much of it is noise (an offset from n steps of noise
    variance s2 has variance s2 / n; the offsets' own spread tau2 is what their estimates vary
    beyond that), so groups that do not differ get ~0, not a noisy offset that adds variance."""
    near, n = _windowed(resid, weights, half)
    seen = weights > 0
    dev = np.where(seen, resid - np.nan_to_num(near), 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        inflate = np.where(n > 1e-12, 1.0 + 1.0 / np.where(n > 1e-12, n, 1.0), np.nan)
        ok = seen & np.isfinite(near) & np.isfinite(inflate)
        s2 = float(np.sum(weights[ok] * dev[ok] ** 2 / inflate[ok]) / max(weights[ok].sum(), 1e-12))
        noise = np.where(n > 1e-12, s2 / np.where(n > 1e-12, n, 1.0), np.inf)
    mix = weights.mean(axis=0)
    off = np.nan_to_num(near)
    centre = (off * mix).sum(axis=1, keepdims=True)
    spread = float(np.mean(((off - centre) ** 2 * mix).sum(axis=1)))
    mean_noise = float(np.mean((np.where(np.isfinite(noise), noise, 0.0) * mix).sum(axis=1)))
    tau2 = max(spread - mean_noise, 0.0)
    return off * (tau2 / (tau2 + noise)) if tau2 > 0 else np.zeros_like(off)


def decompose(
    loss: np.ndarray,
    weights: np.ndarray,
    group_loss: np.ndarray,
    *,
    groups: str = "buckets",
    noise: np.ndarray | None = None,
) -> Jumpiness:
    """Take apart the step-to-step variance of `loss` [T] (every step of a run, in order).

    `weights` [T, G]: each step's share of its supervised tokens in each group (rows add up to
    1); `group_loss` [T, G]: each group's token-mean loss in the step (anything where the
    weight is 0). One group (or none): no composition. `noise` [T]: each step's sampling
    variance (`sampling_variance`), where known. Steps whose loss is not finite are left out.
    The first quarter of the steps is not analysed (module docstring)."""
    y = np.asarray(loss, np.float64)
    W = np.asarray(weights, np.float64).reshape(y.size, -1)
    L = np.asarray(group_loss, np.float64).reshape(y.size, -1)
    s2 = np.full(y.size, np.nan) if noise is None else np.asarray(noise, np.float64)
    keep = np.isfinite(y) & np.isfinite(W).all(axis=1)
    y, W, L, s2 = y[keep], W[keep], L[keep], s2[keep]
    q = y.size // 4
    y, W, L, s2 = y[q:], W[q:], L[q:], s2[q:]
    W = np.where(np.isfinite(L), W, 0.0)
    T = y.size
    kind = groups if W.shape[1] > 1 else "none"
    if T < MIN_STEPS:
        return Jumpiness(T, float("nan"), float("nan"), float("nan"), float("nan"), kind)
    # Half the analysed run each side: offsets estimated from many steps (on known series a
    # narrower window lost more to noise than it gained by following offsets that drift).
    half = max(8, T // 2)
    comp = np.zeros(T)
    for _ in range(3):  # the trend without the composition, the offsets without the trend
        trend = _trend(y - comp)
        if W.shape[1] > 1:
            off = _offsets(L - trend[:, None], W, half)
            off -= (off * W.mean(axis=0)).sum(axis=1, keepdims=True)  # the average mix adds 0
            comp = (W * off).sum(axis=1)
    changes = np.stack([np.diff(y), np.diff(y - trend), np.diff(y - trend - comp)])
    v0 = float(np.var(changes[0]))
    if v0 <= 0:
        return Jumpiness(T, v0, 0.0, 0.0, 0.0, kind)
    # Independent draws: a step-to-step change carries both steps' sampling variances.
    pairs = s2[:-1] + s2[1:]
    p = {k: float(v) for k, v in _shares(changes, pairs).items()}
    parts = (p["schedule"], p["composition"], p["rest"])
    return Jumpiness(T, v0, *parts, kind, p["noise"], _bands(changes, pairs))


def _shares(changes: np.ndarray, pairs: np.ndarray) -> dict[str, np.ndarray]:
    """The sequential shares (module docstring) of step-to-step changes [3, ..., n] (the loss's,
    without the trend, without the composition too) and their sampling variances [..., n]."""
    v0, v1, v2 = np.var(changes, axis=-1)
    v0 = np.where(v0 > 0, v0, np.nan)
    noise = np.mean(pairs, axis=-1) / v0
    known = np.isfinite(pairs).all()
    return {
        "schedule": (v0 - v1) / v0,
        "composition": (v1 - v2) / v0,
        "noise": noise,
        "rest": v2 / v0 - (noise if known else 0.0),
    }


def _bands(changes: np.ndarray, pairs: np.ndarray) -> dict[str, float]:
    """Each share's BAND interval over the run's steps, as half its width: the step-to-step
    changes resampled in blocks of consecutive steps (moving-block bootstrap, blocks of about
    n^(1/3) keep a change with its neighbours, which share a step with it), every share
    recomputed on each resampling. It measures how much the reading moves with which steps
    the run happened to have (on the order of sqrt(2 / steps) of the variance); the trend and
    the offsets are held as fitted, so the bands are a floor on the uncertainty, not a ceiling.
    Deterministic: the resampling is seeded by a tag of its own."""
    n = changes.shape[1]
    block = max(2, round(n ** (1 / 3)))
    rng = np.random.default_rng(JUMPINESS_BAND_STREAM)
    starts = rng.integers(0, n - block + 1, size=(BAND_DRAWS, -(-n // block)))
    # About a million resampled changes at a time: bounded memory however long the run.
    per = max(1, BAND_CHUNK // n)
    drawn: dict[str, list] = {}
    for first in range(0, BAND_DRAWS, per):
        s = starts[first : first + per]
        idx = (s[:, :, None] + np.arange(block)).reshape(len(s), -1)[:, :n]
        with np.errstate(invalid="ignore", divide="ignore"):
            for part, v in _shares(changes[:, idx], pairs[idx]).items():
                drawn.setdefault(part, []).append(v)
    lo, hi = 50 * (1 - BAND), 50 * (1 + BAND)
    out = {}
    for part, chunks in drawn.items():
        values = np.concatenate(chunks)
        ok = values[np.isfinite(values)]
        out[part] = float(np.diff(np.percentile(ok, [lo, hi]))[0] / 2) if ok.size else float("nan")
    return out


def sampling_variance(docs: np.ndarray) -> np.ndarray:
    """[T]: each step's sampling variance, from `docs` [T, 6, G] (per step and group, the sums
    of `pipeline.learn.range_loss.document_stats`: loss, tokens, documents, S^2, S*n, n^2).

    The step's loss is a ratio of sums over the documents it drew; drawn at random within each
    group (a bucket, a length range), a group's mean l_g = sum S_d / sum n_d varies with the
    draw by D_g / (D_g - 1) * sum_d (S_d - l_g n_d)^2 / N_g^2 (the ratio estimator's variance),
    and the step's loss by the groups' variances weighted by (N_g / N)^2. A group with one
    document adds nothing (its spread is unknown): the figure errs low, never high."""
    d = np.asarray(docs, np.float64)
    loss, tok, D, ss, sn, nn = (d[:, i, :] for i in range(6))
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(tok > 0, loss / np.where(tok > 0, tok, 1.0), 0.0)
        spread = np.maximum(ss - 2 * mean * sn + mean**2 * nn, 0.0)
        factor = np.where(D > 1, D / np.where(D > 1, D - 1, 1.0), 0.0)
        N = tok.sum(axis=1)
        return np.where(N > 0, (factor * spread).sum(axis=1) / np.where(N > 0, N, 1.0) ** 2, np.nan)


def decompose_steps(
    loss: np.ndarray,
    bucket: np.ndarray,
    range_loss: np.ndarray | None = None,
    range_tokens: np.ndarray | None = None,
    noise: np.ndarray | None = None,
) -> Jumpiness:
    """`decompose` from a run's step history: the length ranges' sums where the run recorded
    them (every step mixes every length), else each step's bucket (one group per step); each
    step's sampling variance where recorded."""
    y = np.asarray(loss, np.float64)
    if range_loss is not None and range_tokens is not None and np.size(range_tokens):
        tok = np.asarray(range_tokens, np.float64)
        total = tok.sum(axis=1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            W = tok / np.where(total > 0, total, np.nan)
            L = np.asarray(range_loss, np.float64) / np.where(tok > 0, tok, np.nan)
        return decompose(y, W, L, groups="length ranges", noise=noise)
    b = np.asarray(bucket, np.int64)
    G = int(b.max()) + 1 if b.size else 1
    W = np.zeros((y.size, G))
    W[np.arange(y.size), b] = 1.0
    L = np.where(W > 0, y[:, None], np.nan)
    return decompose(y, W, L, groups="buckets", noise=noise)
