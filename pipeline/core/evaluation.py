"""Held-out evaluation, pure: which held-out samples each rank evaluates, and the figures.

Contract 11 (exact evaluation): every held-out sample is evaluated exactly once per evaluation,
on exactly one rank, whatever the world size; a rank with nothing to evaluate is fine. The
batches come from the training planner (`eval_plan`): padded runs evaluate length-sorted batches
under a token budget (the least padding), packed runs evaluate packed rows, each document
attending only to itself. Ranks add up sums, never means (`EvalSums`): the loss is the sum of
token losses over every supervised held-out token divided by their number, so the figures are
the same on 1, 2 or 64 ranks up to float summation order. Also reported: top-1 accuracy, the
mean of each sample's own token-mean loss (every sample weighing the same, whatever its length),
the loss of each training bucket's lengths and, for a run with one bucket (packed rows, or a
baseline batching across all lengths), the loss of each length range its training loss is
reported by (`pipeline.core.length_ranges`). No Ray, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from pipeline.core.buckets import assign
from pipeline.core.config import (
    FixedBatching,
    PlanConfig,
    RunConfig,
    TokenBudgetBatching,
)
from pipeline.core.length_ranges import range_label
from pipeline.core.orders import EVAL_SUBSET_STREAM
from pipeline.core.packing import PackingSpec, pack_epoch
from pipeline.core.plan import EpochPlan, epoch_plan

__all__ = [
    "EvalSums",
    "eval_budget",
    "eval_plan",
    "eval_plan_for",
    "eval_subset",
    "EVAL_FIELDS",
    "EVAL_RANGE_PREFIX",
    "range_metric",
]

# The per-evaluation scalars, in the order of EvalSums.vector(), before the per-bucket sums.
EVAL_FIELDS = ("loss_sum", "correct", "tokens", "samples", "sample_loss_sum")
# The held-out loss of each length range of a run with ranges: <prefix><lo>-<hi>.
EVAL_RANGE_PREFIX = "eval/loss_by_length/"


def eval_subset(sample_ids: np.ndarray, max_samples: int | None) -> np.ndarray:
    """Positions (ascending) of the held-out samples evaluated: all, or a fixed subset of
    `max_samples` drawn from the ids in ascending order, the same in every run and on every
    world size."""
    n = int(np.asarray(sample_ids).size)
    if max_samples is None or max_samples >= n:
        return np.arange(n)
    order = np.argsort(np.asarray(sample_ids), kind="stable")
    pick = np.random.default_rng(EVAL_SUBSET_STREAM).choice(n, size=max_samples, replace=False)
    return np.sort(order[pick])


def eval_budget(cfg: RunConfig, top: int) -> int:
    """Padded tokens per evaluation batch (all ranks): eval.token_budget, else one training
    step's worth of tokens, at least one longest sample."""
    if cfg.eval is not None and cfg.eval.token_budget is not None:
        return max(int(cfg.eval.token_budget), top)
    b = cfg.batching
    if isinstance(b, TokenBudgetBatching):
        return int(b.token_budget)
    if isinstance(b, FixedBatching):
        return int(b.batch_size) * top
    return b.step_tokens


def eval_plan(
    lengths: np.ndarray,
    sample_ids: np.ndarray,
    *,
    top: int,
    world_size: int,
    token_budget: int,
    pad_to_multiple_of: int = 8,
    packing: PackingSpec | None = None,
) -> EpochPlan:
    """The held-out set's batches at `world_size` (contract 11). Padded: length-sorted global
    batches of at most `token_budget` padded tokens, split over the ranks as training's are.
    Packed (`packing`): rows of `packing.row_tokens`, about `token_budget` tokens per step,
    the rows of a step dealt evenly to the ranks. Either way one bucket, [0, top]."""
    edges = [0, int(top)]
    if packing is None:
        batching = TokenBudgetBatching(
            token_budget=max(int(token_budget), int(top)), pad_to_multiple_of=pad_to_multiple_of
        )
        return epoch_plan(
            lengths,
            edges,
            epoch=0,
            world_size=world_size,
            batching=batching,
            plan=PlanConfig(policy="sorted_ascending", longest_first=False),
            sample_ids=sample_ids,
        )
    per_rank = max(1, int(token_budget) // (packing.row_tokens * world_size))
    spec = replace(packing, rows_per_step=per_rank * world_size, longest_first=False)
    return pack_epoch(
        lengths,
        edges,
        seed=0,
        epoch=0,
        world_size=world_size,
        spec=spec,
        sample_ids=sample_ids,
        pad_to_multiple_of=pad_to_multiple_of,
    )


def eval_plan_for(
    cfg: RunConfig, lengths, sample_ids, *, top: int, world_size: int, packing: PackingSpec | None
) -> EpochPlan:
    """`eval_plan` with the run's settings (`packing`: the run's packing spec, or None)."""
    return eval_plan(
        lengths,
        sample_ids,
        top=top,
        world_size=world_size,
        token_budget=eval_budget(cfg, top),
        pad_to_multiple_of=cfg.batching.pad_to_multiple_of,
        packing=packing,
    )


@dataclass
class EvalSums:
    """What one evaluation adds up, on one rank or all of them: token-loss and correct-token
    sums, supervised tokens, samples, the sum of each sample's token-mean loss, per training
    bucket the token-loss sum and tokens, and, for a run with length ranges (`ranges`, the
    edges its training loss is reported by: `pipeline.core.length_ranges.run_ranges`), the same
    per length range. `vector()` is what ranks all-reduce: one vector per evaluation."""

    loss_sum: float
    correct: float
    tokens: float
    samples: float
    sample_loss_sum: float
    bucket_loss: np.ndarray  # [K] token-loss sum of the samples of each training bucket
    bucket_tokens: np.ndarray  # [K]
    range_loss: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [R] per length range
    range_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [R]
    ranges: list[int] = field(default_factory=list)  # the R ranges' edges; [] for none

    @classmethod
    def zeros(cls, num_buckets: int, ranges=()) -> EvalSums:
        z = np.zeros(num_buckets, dtype=np.float64)
        r = np.zeros(max(len(ranges) - 1, 0), dtype=np.float64)
        return cls(0.0, 0.0, 0.0, 0.0, 0.0, z, z.copy(), r, r.copy(), [int(e) for e in ranges])

    @classmethod
    def of_documents(
        cls,
        loss: np.ndarray,
        correct: np.ndarray,
        tokens: np.ndarray,
        lengths: np.ndarray,
        edges,
        ranges=(),
    ) -> EvalSums:
        """The sums of documents with per-document token-loss sums, correct tokens, supervised
        tokens and lengths (which training bucket each falls in, by `edges`, and which length
        range, by `ranges`: range r holds lengths in (e_r, e_r+1], longer ones the last)."""
        edges = np.asarray(edges, dtype=np.int64)
        K = edges.size - 1
        bucket = assign(np.minimum(lengths, edges[-1]), edges)
        supervised = tokens > 0
        per_sample = np.where(supervised, loss / np.maximum(tokens, 1), 0.0)
        out = cls(
            loss_sum=float(loss.sum()),
            correct=float(correct.sum()),
            tokens=float(tokens.sum()),
            samples=float(supervised.sum()),
            sample_loss_sum=float(per_sample.sum()),
            bucket_loss=np.bincount(bucket, weights=loss, minlength=K).astype(np.float64),
            bucket_tokens=np.bincount(bucket, weights=tokens, minlength=K).astype(np.float64),
            ranges=[int(e) for e in ranges],
        )
        if out.ranges:
            R = len(out.ranges) - 1
            r = assign(np.clip(lengths, 1, out.ranges[-1]), out.ranges)
            out.range_loss = np.bincount(r, weights=loss, minlength=R).astype(np.float64)
            out.range_tokens = np.bincount(r, weights=tokens, minlength=R).astype(np.float64)
        return out

    def __add__(self, other: EvalSums) -> EvalSums:
        if list(self.ranges) != list(other.ranges):
            raise ValueError(f"sums by length ranges {self.ranges} and {other.ranges}")
        v = self.vector() + other.vector()
        return EvalSums.from_vector(v, self.bucket_loss.size, self.ranges)

    def vector(self) -> np.ndarray:
        head = [getattr(self, f) for f in EVAL_FIELDS]
        parts = [head, self.bucket_loss, self.bucket_tokens, self.range_loss, self.range_tokens]
        return np.concatenate(parts).astype(np.float64)

    @classmethod
    def from_vector(cls, v: np.ndarray, num_buckets: int, ranges=()) -> EvalSums:
        v = np.asarray(v, dtype=np.float64)
        n, K, R = len(EVAL_FIELDS), num_buckets, max(len(ranges) - 1, 0)
        if v.size != n + 2 * K + 2 * R:
            raise ValueError(f"an evaluation vector of {v.size} values, not {n + 2 * K + 2 * R}")
        head = dict(zip(EVAL_FIELDS, (float(x) for x in v[:n]), strict=True))
        b, r = v[n : n + 2 * K], v[n + 2 * K :]
        return cls(
            **head,
            bucket_loss=b[:K].copy(),
            bucket_tokens=b[K:].copy(),
            range_loss=r[:R].copy(),
            range_tokens=r[R:].copy(),
            ranges=[int(e) for e in ranges],
        )

    def metrics(self) -> dict[str, float]:
        """`eval/*` figures: loss (token-weighted), accuracy, loss_per_sample, tokens, samples,
        loss_by_bucket/<k> for each training bucket with held-out tokens and, with length
        ranges, loss_by_length/<lo>-<hi> for every range (NaN: no held-out token of it), named
        as the training loss's `train/loss_by_length/<lo>-<hi>`."""
        nan = float("nan")
        out = {
            "eval/loss": self.loss_sum / self.tokens if self.tokens else nan,
            "eval/accuracy": self.correct / self.tokens if self.tokens else nan,
            "eval/loss_per_sample": self.sample_loss_sum / self.samples if self.samples else nan,
            "eval/tokens": self.tokens,
            "eval/samples": self.samples,
        }
        for k, (s, t) in enumerate(zip(self.bucket_loss, self.bucket_tokens, strict=True)):
            if t > 0:
                out[f"eval/loss_by_bucket/{k}"] = float(s / t)
        for r, (s, t) in enumerate(zip(self.range_loss, self.range_tokens, strict=True)):
            out[range_metric(self.ranges, r)] = float(s / t) if t > 0 else nan
        return out


def range_metric(ranges, r: int) -> str:
    """The held-out metric of length range r of `ranges`: `eval/loss_by_length/<lo>-<hi>`."""
    return f"{EVAL_RANGE_PREFIX}{range_label(list(ranges), r)}"
