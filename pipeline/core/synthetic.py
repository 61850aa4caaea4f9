"""Seed-calibrated synthetic corpus: lengths matching the team's 902K-sample run, learnable tokens.

Lengths: 85% lognormal(7.05, 0.5) + 15% lognormal(5.8, 0.8), rounded and clipped to [16, 8192],
calibrated so that random batching's padding efficiency relative to sorted matches the team's
real corpus (BENCHMARKS.md has the current figures). Tokens: each sample walks a fixed random permutation of the vocabulary with a
per-sample stride in 1..4, plus 5% noise tokens, so the next token is nearly determined by the two
before it (a small model's loss falls well below ln(vocab)), and generation is one vectorized
expression per shard.
"""

from __future__ import annotations

import numpy as np

from pipeline.core.orders import (
    SYNTHETIC_LENGTHS_STREAM,
    SYNTHETIC_NOISE_STREAM,
    SYNTHETIC_VOCAB_STREAM,
)

__all__ = ["PRESETS", "seed902k_lengths", "synthetic_tokens"]

PRESETS = {"seed902k": 902_087}
MIN_LEN, MAX_LEN = 16, 8192


def seed902k_lengths(num_samples: int = PRESETS["seed902k"], seed: int = 0) -> np.ndarray:
    """Sample lengths of the seed-calibrated preset (int32), deterministic from `seed`."""
    rng = np.random.default_rng((seed, SYNTHETIC_LENGTHS_STREAM))
    long_ = rng.lognormal(7.05, 0.5, num_samples)
    short = rng.lognormal(5.8, 0.8, num_samples)
    pick = rng.random(num_samples) < 0.85
    return np.clip(np.round(np.where(pick, long_, short)), MIN_LEN, MAX_LEN).astype(np.int32)


def synthetic_tokens(
    lengths: np.ndarray,
    sample_ids: np.ndarray,
    *,
    vocab_size: int,
    seed: int = 0,
    noise: float = 0.05,
) -> tuple[np.ndarray, np.ndarray]:
    """Token ids for the given samples: (flat int32 values, int64 offsets).

    A sample's walk depends on (seed, sample_id); noise on (seed, the call's first id and count),
    so a corpus is reproducible for a given shard layout.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    sample_ids = np.asarray(sample_ids, dtype=np.int64)
    perm = (
        np.random.default_rng((seed, SYNTHETIC_VOCAB_STREAM))
        .permutation(vocab_size)
        .astype(np.int32)
    )
    # Per-sample parameters from a counter-based hash of the id (no sequential RNG state).
    h = _mix(sample_ids.astype(np.uint64) ^ np.uint64(seed * 0x9E3779B97F4A7C15 % 2**64))
    start = (h % np.uint64(vocab_size)).astype(np.int64)
    stride = ((h >> np.uint64(20)) % np.uint64(4)).astype(np.int64) + 1
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    n = lengths.size
    row = np.repeat(np.arange(n, dtype=np.int32), lengths)
    col = np.arange(offsets[-1], dtype=np.int32) - np.repeat(offsets[:-1].astype(np.int32), lengths)
    col *= np.repeat(stride.astype(np.int32), lengths)
    col += start.astype(np.int32)[row]
    col %= np.int32(vocab_size)
    values = perm[col]
    # Noise drawn per call: deterministic for a given (seed, first id, count), i.e. per shard.
    first = int(sample_ids[0]) if n else 0
    rng = np.random.default_rng((seed, SYNTHETIC_NOISE_STREAM, first, n))
    is_noise = rng.random(values.size, dtype=np.float32) < noise
    values[is_noise] = rng.integers(0, vocab_size, int(is_noise.sum()), dtype=np.int32)
    return values.astype(np.int32), offsets


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a fast, well-mixed hash of uint64 arrays."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x
