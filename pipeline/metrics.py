"""Metric math without Ray: padding efficiency and the bucket-debiased running loss."""

from __future__ import annotations

import numpy as np

__all__ = ["micro_batch_padded", "padding_efficiency", "BucketLossTracker"]


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


class BucketLossTracker:
    """Running per-bucket loss and the debiased step loss.

    Each bucket's loss differs systematically (short and long samples are not equally hard), so the
    raw step loss jumps with the bucket mix. The debiased loss removes the step's bucket offset:
    loss - (running loss of its bucket - overall running loss). A bucket's running loss is an EMA
    (`decay`) so offsets follow training; the overall level is the bucket EMAs weighted by how often
    each bucket was seen, which keeps it steady under a random bucket mix (an EMA of the raw loss
    would itself jump with the mix). A bucket not seen yet has offset 0.
    """

    def __init__(self, num_buckets: int, decay: float = 0.98):
        self.decay = decay
        self.bucket_mean = np.full(num_buckets, np.nan)
        self.counts = np.zeros(num_buckets)

    @property
    def overall(self) -> float:
        seen = self.counts > 0
        if not seen.any():
            return float("nan")
        return float((self.bucket_mean[seen] * self.counts[seen]).sum() / self.counts[seen].sum())

    def update(self, bucket: int, loss: float) -> float:
        """Record a step's loss; return its debiased loss."""
        old = self.bucket_mean[bucket]
        self.bucket_mean[bucket] = (
            loss if np.isnan(old) else self.decay * old + (1 - self.decay) * loss
        )
        self.counts[bucket] += 1
        return float(loss - (self.bucket_mean[bucket] - self.overall))

    def state_dict(self) -> dict:
        return {
            "bucket_mean": self.bucket_mean.tolist(),
            "counts": self.counts.tolist(),
            "decay": self.decay,
        }

    def load_state_dict(self, d: dict) -> None:
        self.bucket_mean = np.asarray(d["bucket_mean"], dtype=float)
        self.counts = np.asarray(d["counts"], dtype=float)
        self.decay = float(d["decay"])


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
