"""Metric math without Ray: padding efficiency and the bucket-debiased running loss."""

from __future__ import annotations

import numpy as np

__all__ = [
    "micro_batch_padded",
    "padding_efficiency",
    "truncation_counts",
    "BucketLossTracker",
]


def micro_batch_padded(
    lengths: np.ndarray, offsets: np.ndarray, *, multiple: int = 1, cap: np.ndarray | None = None
) -> np.ndarray:
    """Padded slots of each micro-batch: size x (batch max rounded up to `multiple`, capped)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    sizes = np.diff(offsets)
    nonempty = sizes > 0
    maxlen = np.zeros(sizes.size, dtype=np.int64)
    if nonempty.any():
        maxlen[nonempty] = np.maximum.reduceat(
            np.asarray(lengths, dtype=np.int64), offsets[:-1][nonempty]
        )
    padded_len = -(-maxlen // multiple) * multiple
    if cap is not None:
        padded_len = np.minimum(padded_len, np.maximum(cap, maxlen))
    return sizes * padded_len


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


class BucketLossTracker:
    """Per-bucket loss offsets and the bucket-debiased step loss.

    Buckets differ systematically in loss (short and long samples are not equally hard), so the
    raw step loss jumps with the bucket mix. The tracker keeps a running level of the loss and, per
    bucket, a running mean of (step loss - level) over that bucket's steps: its offset. Offsets
    are relative to the level, so a falling loss does not make them stale; they are shrunk towards
    0 by n / (n + prior_visits) until a bucket has been seen often enough to trust, and centred so
    their visit-weighted mean is 0. The debiased loss is the step loss minus its bucket's offset
    from before this step. With real offsets the debiased curve's step-to-step variance drops well
    below the raw one; where buckets barely differ, it adds little noise of its own
    (tests/unit/test_metrics.py checks both; BENCHMARKS.md has measured figures).
    """

    def __init__(self, num_buckets: int, decay: float = 0.9, prior_visits: float = 8.0):
        self.decay = decay
        self.prior_visits = prior_visits
        self.sums = np.zeros(num_buckets)  # EMA numerators of (loss - level), bias-corrected below
        self.counts = np.zeros(num_buckets)
        self.level = float("nan")

    def offsets(self) -> np.ndarray:
        """Current centred, shrunk offset of each bucket (0 for a bucket not seen yet)."""
        n = self.counts
        seen = n > 0
        raw = np.zeros_like(self.sums)
        raw[seen] = self.sums[seen] / (1 - self.decay ** n[seen])
        off = raw * n / (n + self.prior_visits)
        if seen.any():
            off[seen] -= (off[seen] * n[seen]).sum() / n[seen].sum()
        return off

    @property
    def bucket_mean(self) -> np.ndarray:
        """Running loss of each bucket (level + offset); NaN for a bucket not seen yet."""
        return np.where(self.counts > 0, self.level + self.offsets(), np.nan)

    def update(self, bucket: int, loss: float) -> float:
        """Record a step's loss; return its debiased loss."""
        if np.isnan(self.level):
            self.level = float(loss)
        debiased = float(loss - self.offsets()[bucket])
        d = self.decay
        self.sums[bucket] = d * self.sums[bucket] + (1 - d) * (loss - self.level)
        self.counts[bucket] += 1
        self.level = d * self.level + (1 - d) * float(loss - self.offsets()[bucket])
        return debiased

    def state_dict(self) -> dict:
        return {
            "sums": self.sums.tolist(),
            "counts": self.counts.tolist(),
            "level": self.level,
            "decay": self.decay,
            "prior_visits": self.prior_visits,
        }

    def load_state_dict(self, d: dict) -> None:
        self.sums = np.asarray(d["sums"], dtype=float)
        self.counts = np.asarray(d["counts"], dtype=float)
        self.level = float(d["level"])
        self.decay = float(d["decay"])
        self.prior_visits = float(d["prior_visits"])


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
