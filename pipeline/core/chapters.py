"""Chapters: an epoch plan cut into consecutive global-step ranges, prepared and freed one by one.

A whole-epoch sort holds every token of the epoch in the object store at once (twice while it
sorts, and again for the next epoch prepared ahead). Cutting the epoch's global steps into
chapters bounds that to about two chapters, and the first step waits for one chapter's
preparation instead of the epoch's. Chaptering changes when rows are read and sorted, never
which rows a rank trains at which step: a chapter is the plan restricted to its steps
(`chapter_plan`), so its rank views are exactly the matching slices of the epoch's, and the plan
hash is the epoch's.

Chapters are cut on real tokens (what the object store holds: unpadded int32 ids, padding is
added on the worker) and/or on steps; both are world-size independent, so the boundaries do not
move when a run resumes on another number of workers. Boundaries are computed on the full epoch
plan and a resume at step s starts in the chapter holding s, from s (`chapters_from`).

The price is reading: with a global within-bucket shuffle every chapter draws its samples from
nearly every row group, so each chapter re-reads (and decodes) almost the whole corpus.
`chapter_read_bytes` estimates it from the index's per-sample row groups. Measured on the
902,087-sample preset (seed902k lengths, the team's edges and token budget, 32 shards; see
`bench.chapters`): every chapter touches 100% of the row groups at 16K, 4K and 1K rows
per row group alike, for 2, 4, 8 and 16 chapters, so bytes read per epoch are C times the corpus
(C = 1, 2, 4, 8, 16 chapters: 1x, 2x, 4x, 8x, 16x; 4.25 GB of int32 ids and sample ids per
pass). Even 64-row row groups still read 15.7x at 16 chapters, so the layout cannot buy this
back (only a plan that shuffles within row-group windows could, and that changes the plan); the
default `delivery.chapter_tokens` is the largest chapter that keeps the object store
comfortable: 2**28 tokens (1 GiB of int32 ids): the 902K preset is 4 chapters, read in the
background of training, and about two are held at once (object-store peaks against the
whole epoch's: `python -m jobs.bench_data --num-samples 902087 --shards 32 --chapter-tokens
268435456,0`, and BENCHMARKS.md, section 4). Corpora below 2**28 tokens are one chapter
(unchanged behaviour, no extra reads).

Which range each request is served -- the chapter bounds the config asks for, a lead-in at a
start, each range's end decided once -- is `pipeline.core.ranges`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.core.plan import EpochPlan

__all__ = [
    "Chapter",
    "step_tokens",
    "chapter_bounds",
    "plan_chapter_bounds",
    "chapters_from",
    "chapter_of",
    "chapter_end",
    "chapter_plan",
    "row_group_of",
    "chapter_read_bytes",
]

# Balanced cuts tried (chapter counts above the lower bound) before the greedy fallback.
_BALANCE_TRIES = 16


@dataclass(frozen=True)
class Chapter:
    """Global steps [first_step, end_step) of an epoch; `index` counts from the epoch's start."""

    index: int
    first_step: int
    end_step: int

    @property
    def num_steps(self) -> int:
        return self.end_step - self.first_step


def step_tokens(plan: EpochPlan) -> np.ndarray:
    """Real tokens of each global step of `plan` (int64, world-size independent)."""
    if plan.num_samples == 0:
        return np.zeros(plan.num_steps, np.int64)
    cum = np.concatenate([[0], np.cumsum(plan.lengths, dtype=np.int64)])
    return cum[plan.step_offsets[1:]] - cum[plan.step_offsets[:-1]]


def chapter_bounds(
    tokens: np.ndarray,
    *,
    max_steps: int | None = None,
    max_tokens: int | None = None,
    first_step: int = 0,
) -> np.ndarray:
    """Boundaries [C + 1] (absolute steps) of chapters holding at most `max_steps` steps and at
    most `max_tokens` tokens each, given each step's `tokens`; None: no limit.

    A step over `max_tokens` on its own is a chapter by itself. Among the fewest-chapter cuts
    tried, chapters are balanced (equal tokens, or equal steps when the step limit is the one
    that needs more chapters), so the first chapter -- the one the first step waits for -- is no
    larger than it needs to be.
    """
    t = np.asarray(tokens, dtype=np.int64)
    for name, v in (("max_steps", max_steps), ("max_tokens", max_tokens)):
        if v is not None and v < 1:
            raise ValueError(f"{name} must be >= 1 or None, got {v}")
    S = int(t.size)
    if S == 0 or (max_steps is None and max_tokens is None):
        return np.array([first_step, first_step + S], dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(t)])
    by_steps = -(-S // max_steps) if max_steps else 0
    by_tokens = -(-int(cum[-1]) // max_tokens) if max_tokens else 0
    lower = max(by_steps, by_tokens, 1)
    for c in range(lower, min(S, lower + _BALANCE_TRIES) + 1):
        # balanced on whichever limit needs more chapters
        b = _even_cut(cum, c, by_tokens=by_tokens >= by_steps)
        if _fits(b, cum, max_steps, max_tokens):
            return b + first_step
    return _greedy_cut(cum, max_steps, max_tokens) + first_step


def _even_cut(cum: np.ndarray, c: int, *, by_tokens: bool) -> np.ndarray:
    """Step boundaries splitting the steps (or their tokens) into `c` near-equal chapters."""
    S = cum.size - 1
    if by_tokens:
        targets = cum[-1] * np.arange(1, c) / c
        hi = np.clip(np.searchsorted(cum, targets), 1, S)
        # the nearer of the two step boundaries around each target
        cut = np.where(targets - cum[hi - 1] < cum[hi] - targets, hi - 1, hi)
    else:
        cut = np.round(S * np.arange(1, c) / c).astype(np.int64)
    return np.unique(np.concatenate([[0], np.clip(cut, 1, S - 1) if S > 1 else [], [S]])).astype(
        np.int64
    )


def _fits(b: np.ndarray, cum: np.ndarray, max_steps, max_tokens) -> bool:
    steps = np.diff(b)
    ok = steps >= 1
    if max_steps is not None:
        ok &= steps <= max_steps
    if max_tokens is not None:
        ok &= (cum[b[1:]] - cum[b[:-1]] <= max_tokens) | (steps == 1)
    return bool(ok.all())


def _greedy_cut(cum: np.ndarray, max_steps, max_tokens) -> np.ndarray:
    """Each chapter as long as the limits allow: the fewest chapters, the last one short."""
    S = cum.size - 1
    b, a = [0], 0
    while a < S:
        e = S if max_steps is None else min(S, a + max_steps)
        if max_tokens is not None:
            e = min(e, int(np.searchsorted(cum, cum[a] + max_tokens, side="right")) - 1)
        a = max(e, a + 1)
        b.append(a)
    return np.asarray(b, dtype=np.int64)


def plan_chapter_bounds(
    plan: EpochPlan, *, max_steps: int | None = None, max_tokens: int | None = None
) -> np.ndarray:
    """`chapter_bounds` of a plan; pass the full epoch's plan so a resume keeps the boundaries."""
    return chapter_bounds(
        step_tokens(plan), max_steps=max_steps, max_tokens=max_tokens, first_step=plan.first_step
    )


def chapter_end(bounds: np.ndarray, step: int) -> int:
    """End (exclusive) of the chapter holding `step`; the epoch's end for `step` at the end."""
    b = np.asarray(bounds)
    return int(b[-1]) if step == b[-1] else int(b[chapter_of(b, step) + 1])


def chapter_of(bounds: np.ndarray, step: int) -> int:
    """Index of the chapter holding global step `step`."""
    b = np.asarray(bounds)
    if not b[0] <= step < b[-1]:
        raise ValueError(f"step {step} outside the chapters' steps [{int(b[0])}, {int(b[-1])})")
    return int(np.searchsorted(b, step, side="right") - 1)


def chapters_from(bounds: np.ndarray, step: int) -> list[Chapter]:
    """The chapters still to deliver when (re)starting at global step `step`: the chapter holding
    `step`, from `step`, then every later one. Empty at the epoch's end."""
    b = np.asarray(bounds, dtype=np.int64)
    if step == b[-1]:
        return []
    c = chapter_of(b, step)
    return [Chapter(i, step if i == c else int(b[i]), int(b[i + 1])) for i in range(c, b.size - 1)]


def chapter_plan(plan: EpochPlan, first_step: int, end_step: int) -> EpochPlan:
    """`plan` restricted to global steps [first_step, end_step): same steps, ranks, order and hash.

    Its `sort_keys` number the chapter's rows only, so each chapter is keyed, sorted and split
    on its own, and its rank views are the matching slices of the epoch's.
    """
    return plan.slice(first_step, end_step)


# --------------------------------------------------------------------------- read estimate


def row_group_of(file_idx: np.ndarray, rows: np.ndarray, row_groups) -> np.ndarray:
    """Global row-group number (file after file) of each sample, from the index's per-sample
    file and row-in-file and each file's row-group row counts (`LengthIndex.row_groups`)."""
    counts = [np.asarray(r, dtype=np.int64) for r in row_groups]
    per_file = np.array([c.size for c in counts], dtype=np.int64)
    first_rg = np.concatenate([[0], np.cumsum(per_file)[:-1]]).astype(np.int64)
    ends = [np.cumsum(c) for c in counts]
    fidx = np.asarray(file_idx, dtype=np.int64)
    rows = np.asarray(rows, dtype=np.int64)
    out = np.empty(fidx.size, dtype=np.int64)
    for f in np.unique(fidx):  # one searchsorted per file, not per sample
        m = fidx == f
        out[m] = first_rg[f] + np.searchsorted(ends[f], rows[m], side="right")
    return out


def chapter_read_bytes(
    plan: EpochPlan, bounds: np.ndarray, row_group: np.ndarray, row_group_bytes: np.ndarray
) -> dict:
    """Row groups each chapter must read, and the bytes that makes per epoch.

    `row_group` is the global row group of each planned row (aligned with plan.sample_ids),
    `row_group_bytes` the size of every row group (what reading one costs). A chapter reads each
    row group holding any of its rows once; the epoch reads the sum over its chapters.
    """
    rg = np.asarray(row_group, dtype=np.int64)
    size = np.asarray(row_group_bytes, dtype=np.float64)
    b = np.asarray(bounds, dtype=np.int64) - plan.first_step
    row_bounds = plan.step_offsets[b]
    chapter = np.searchsorted(row_bounds, np.arange(rg.size), side="right") - 1
    U = size.size
    pair = np.unique(chapter * U + rg)
    ch, u = pair // U, pair % U
    C = b.size - 1
    touched = np.bincount(ch, minlength=C)
    read = np.bincount(ch, weights=size[u], minlength=C)
    corpus = float(size.sum())
    return {
        "chapters": C,
        "row_groups": U,
        "touched": touched.tolist(),
        "bytes": read.tolist(),
        "epoch_bytes": float(read.sum()),
        "corpus_bytes": corpus,
        "amplification": float(read.sum() / corpus) if corpus else 0.0,
    }
