"""Metric math without Ray: padding efficiency and the bucket-debiased running loss."""

from __future__ import annotations

import numpy as np

from pipeline.core.collate import padded_length

__all__ = [
    "micro_batch_padded",
    "padding_efficiency",
    "truncation_counts",
    "BucketLossTracker",
]


def micro_batch_padded(
    lengths: np.ndarray, offsets: np.ndarray, *, multiple: int = 1, cap: np.ndarray | None = None
) -> np.ndarray:
    """Padded slots of each micro-batch: size x its padded length (collate.padded_length: the
    batch max rounded up to `multiple`, never beyond `cap`, each micro-batch's bucket edge;
    None: no edge; a cap below the micro-batch's own max is ignored, see below)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    sizes = np.diff(offsets)
    nonempty = sizes > 0
    maxlen = np.zeros(sizes.size, dtype=np.int64)
    if nonempty.any():
        maxlen[nonempty] = np.maximum.reduceat(
            np.asarray(lengths, dtype=np.int64), offsets[:-1][nonempty]
        )
    # A cap below a micro-batch's own max is not its edge (e.g. the first bucket's edge given
    # for a plan batched across all lengths): that micro-batch counts at its max, unrounded.
    edge = None if cap is None else np.maximum(cap, maxlen)
    return sizes * padded_length(maxlen, edge, multiple)


def padding_efficiency(
    lengths: np.ndarray, offsets: np.ndarray, *, multiple: int = 1, cap: np.ndarray | None = None
) -> float:
    """Real tokens / padded slots over a set of micro-batches given as (lengths, offsets)."""
    padded = micro_batch_padded(lengths, offsets, multiple=multiple, cap=cap).sum()
    real = np.asarray(lengths)[offsets[0] : offsets[-1]].sum()
    return float(real / padded) if padded else 1.0


def truncation_counts(lengths: np.ndarray, top: int) -> dict[str, int]:
    """What cutting samples at `top` tokens (data.over_length=truncate) removes, from the samples'
    full lengths: `truncated_samples` (samples longer than `top`), `truncated_tokens` (tokens cut
    off them) and `tokens` (all tokens before the cut)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    over = lengths - top
    cut = over[over > 0]
    return {
        "truncated_samples": int(cut.size),
        "truncated_tokens": int(cut.sum()),
        "tokens": int(lengths.sum()),
    }


def readability_ratio(raw: np.ndarray, debiased: np.ndarray) -> tuple[float, float, float]:
    """(variance of the step-to-step change of the raw loss, the same of the debiased loss,
    debiased / raw) over the steps where both are finite. Variance of first differences: a slow
    trend barely contributes, the jumps a bucket change causes do; below 1, the debiased curve is
    the steadier one to read. NaN where fewer than 3 steps are left."""
    raw, debiased = np.asarray(raw, np.float64), np.asarray(debiased, np.float64)
    ok = np.isfinite(raw) & np.isfinite(debiased)
    d_raw, d_deb = np.diff(raw[ok]), np.diff(debiased[ok])
    if d_raw.size < 2:
        return float("nan"), float("nan"), float("nan")
    var_raw, var_deb = float(np.var(d_raw)), float(np.var(d_deb))
    return var_raw, var_deb, var_deb / var_raw if var_raw > 0 else float("nan")


class BucketLossTracker:
    """Per-bucket loss offsets and the bucket-debiased step loss.

    Buckets differ systematically in loss (short and long samples are not equally hard), so the
    raw step loss jumps with the bucket mix. Before each step the tracker fits the last `window`
    steps (bucket, loss) by least squares as

        loss = level + slope * (steps ago) + beta * z[bucket] + r[bucket] + m[bucket]

    - level and slope: the local trend from the neighbouring steps, so a falling loss does not
      leak into the offsets;
    - beta * z: z is the bucket's position in length order (buckets are sorted by length, and
      loss follows length); one shared beta lets a bucket seen once or never in the window still
      get an offset, and a short window follows offsets that change as training goes on (on real
      text they grow from ~0 to tenths of a nat within a few hundred steps);
    - r: each bucket's own deviation in the window, shrunk towards 0 by `ridge` (a bucket with n
      steps in the window keeps about n / (n + ridge) of it);
    - m: each bucket's remembered deviation from that fit over all its steps (a running mean
      with `memory` per visit), for offsets that do not follow length. It is shrunk by
      n / (n + p), with p = noise variance / variance of the buckets' deviations estimated on
      the run itself: ~0 where buckets differ only by length, ~all of it where they differ
      otherwise.

    Offsets are centred so their mean over the window's steps is 0. The debiased loss is the step
    loss minus its bucket's offset fitted on the steps before it, never on itself or later
    steps. Where buckets differ, the debiased curve's step-to-step variance drops well below the
    raw one; where they do not, it adds little noise (tests/unit/test_metrics.py checks both;
    BENCHMARKS.md has measured figures on synthetic and on real text).
    """

    def __init__(
        self, num_buckets: int, window: int = 24, ridge: float = 10.0, memory: float = 0.9
    ):
        assert window >= 3 and 0 < memory < 1, (window, memory)
        self.num_buckets = num_buckets
        self.window, self.ridge, self.memory = window, ridge, memory
        self.buckets: list[int] = []  # the last `window` steps, oldest first
        self.losses: list[float] = []
        self.counts = np.zeros(num_buckets)  # steps seen per bucket, over the whole run
        self.deviation = np.zeros(num_buckets)  # running-mean numerators of m (bias-corrected)
        self.noise = np.zeros(2)  # running sum of squared deviation changes, and its weight

    def _remembered(self) -> tuple[np.ndarray, np.ndarray]:
        """(each bucket's remembered deviation, the same shrunk by its empirical-Bayes prior)."""
        n, d = self.counts, self.memory
        seen = n > 0
        mean = np.zeros_like(self.deviation)
        mean[seen] = self.deviation[seen] / (1 - d ** n[seen])
        n_eff = np.minimum(n, (1 + d) / (1 - d))  # a running mean's effective sample size
        prior = 1e3
        if seen.sum() >= 3 and self.noise[1] > 5:
            noise = self.noise[0] / self.noise[1]
            spread = np.var(mean[seen]) - np.mean(noise / n_eff[seen])
            prior = float(np.clip(noise / spread, 1.0, 1e3)) if spread > 0 else prior
        return mean, mean * n_eff / (n_eff + prior)

    def _fit(self) -> tuple[float, np.ndarray, np.ndarray]:
        """(level now, each bucket's offset before centring, its part fitted on the window: the
        offset less m); no offsets until the window holds 3 steps of at least 2 buckets."""
        b = np.asarray(self.buckets, dtype=np.int64)
        y = np.asarray(self.losses, dtype=np.float64)
        K = self.num_buckets
        if y.size < 3 or np.unique(b).size < 2:
            level = float(y.mean()) if y.size else float("nan")
            return level, np.zeros(K), np.zeros(K)
        _, m = self._remembered()
        z = (np.arange(K) - (K - 1) / 2) / max(K / 2, 1)  # length order, about -1..1
        X = np.zeros((y.size, 3 + K))
        X[:, 0] = 1.0
        X[:, 1] = (np.arange(y.size) - y.size) / self.window  # steps ago, scaled
        X[:, 2] = z[b]
        X[np.arange(y.size), 3 + b] = 1.0
        penalty = np.r_[np.full(3, 1e-9), np.full(K, self.ridge)]
        coef = np.linalg.solve(X.T @ X + np.diag(penalty), X.T @ (y - m[b]))
        window = coef[2] * z + coef[3:]
        return float(coef[0]), window + m, window

    def offsets(self) -> np.ndarray:
        """Current offset of each bucket, centred on the window's steps (0 for every bucket until
        the window can be fitted)."""
        _, off, _ = self._fit()
        return off - off[np.asarray(self.buckets, dtype=np.int64)].mean() if self.buckets else off

    @property
    def bucket_mean(self) -> np.ndarray:
        """Current loss of each bucket from the fit (level + its offset); NaN for a bucket not
        seen yet."""
        level, off, _ = self._fit()
        return np.where(self.counts > 0, level + off, np.nan)

    def update(self, bucket: int, loss: float) -> float:
        """Record a step's loss; return its debiased loss."""
        level, off, window = self._fit()
        centre = off[np.asarray(self.buckets, dtype=np.int64)].mean() if self.buckets else 0.0
        debiased = float(loss - (off[bucket] - centre))
        if not np.isnan(level) and window.any():  # the window was fitted: remember the rest
            mean, _ = self._remembered()
            e = loss - level - window[bucket]
            if self.counts[bucket] > 0:
                self.noise = 0.99 * self.noise + np.array([(e - mean[bucket]) ** 2, 1.0])
            d = self.memory
            self.deviation[bucket] = d * self.deviation[bucket] + (1 - d) * e
        self.buckets.append(int(bucket))
        self.losses.append(float(loss))
        del self.buckets[: -self.window], self.losses[: -self.window]
        self.counts[bucket] += 1
        return debiased

    def state_dict(self) -> dict:
        return {
            "buckets": list(self.buckets),
            "losses": list(self.losses),
            "counts": self.counts.tolist(),
            "deviation": self.deviation.tolist(),
            "noise": self.noise.tolist(),
            "window": self.window,
            "ridge": self.ridge,
            "memory": self.memory,
        }

    def load_state_dict(self, d: dict) -> None:
        self.counts = np.asarray(d["counts"], dtype=float)
        # A checkpoint written before the windowed fit holds only counts: the rest refills.
        self.buckets = [int(x) for x in d.get("buckets", [])]
        self.losses = [float(x) for x in d.get("losses", [])]
        self.deviation = np.asarray(d.get("deviation", np.zeros_like(self.counts)), dtype=float)
        self.noise = np.asarray(d.get("noise", [0.0, 0.0]), dtype=float)
        self.window = int(d.get("window", self.window))
        self.ridge = float(d.get("ridge", self.ridge))
        self.memory = float(d.get("memory", self.memory))


def batch_recomposition(
    ids_a: np.ndarray, offsets_a: np.ndarray, ids_b: np.ndarray, offsets_b: np.ndarray
) -> float:
    """Share of micro-batches of epoch b that contain a pair of samples which already shared a
    micro-batch in epoch a (sorted-static: ~1.0; a fresh shuffle: ~0). Micro-batches are given as
    (sample ids, offsets); samples missing from epoch a count as never paired."""
    ids_a, ids_b = np.asarray(ids_a, dtype=np.int64), np.asarray(ids_b, dtype=np.int64)
    mb_a = np.repeat(np.arange(np.size(offsets_a) - 1), np.diff(offsets_a))
    order = np.argsort(ids_a)
    pos = np.searchsorted(ids_a[order], ids_b)
    pos = np.minimum(pos, ids_a.size - 1)
    found = ids_a[order][pos] == ids_b
    prev_mb = np.where(found, mb_a[order][pos], -1 - np.arange(ids_b.size))  # unique when missing
    mb_b = np.repeat(np.arange(np.size(offsets_b) - 1), np.diff(offsets_b))
    pair = (
        mb_b.astype(np.int64) * (mb_a.size + ids_b.size + 1) + prev_mb
    )  # (batch in b, batch in a)
    uniq, counts = np.unique(pair, return_counts=True)
    repeated_b = np.unique(uniq[counts > 1] // (mb_a.size + ids_b.size + 1))
    nonempty = int((np.diff(offsets_b) > 0).sum())
    return float(repeated_b.size / nonempty) if nonempty else 0.0


def switch_rate(step_buckets: np.ndarray) -> tuple[float, float]:
    """(observed share of consecutive steps that change bucket, expected share under independent
    draws with the same bucket frequencies: 1 - sum p_k^2)."""
    b = np.asarray(step_buckets)
    if b.size < 2:
        return 0.0, 0.0
    p = np.bincount(b) / b.size
    return float(np.mean(b[1:] != b[:-1])), float(1 - (p**2).sum())
