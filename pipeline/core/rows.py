"""The packed layout of an epoch plan: how the epoch was packed, and its rows of whole samples.

A packed `EpochPlan` (pipeline.core.plan) holds a `PackedRows`: step s holds rows
[step_rows[s], step_rows[s+1]), row r holds the plan's samples [row_offsets[r], row_offsets[r+1]).
A rank's micro-batch is its equal share of its step's rows (`plan.split_offsets` over the rows),
so no row is ever cut; the world size must divide `rows_per_step` (`check_world_size`). How rows
are filled, balanced and ordered is pipeline.core.packing's; this module is only their shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.core.sections import ConfigError

__all__ = ["PackingSpec", "PackedRows", "check_world_size"]


@dataclass(frozen=True)
class PackingSpec:
    """How an epoch is packed. Sizes in tokens and rows; every field is part of the plan hash."""

    row_tokens: int  # tokens per row; at least the longest sample
    rows_per_step: int  # rows per GLOBAL step (all ranks together)
    attention_width: int  # the cost model's width (packing.attention_width_for(d_model))
    open_rows: int = 16  # best-fit window: rows open at once, per bucket
    balance_rows: int = 512  # rows sorted by cost together; rounded up to whole steps
    longest_first: bool = True  # the costliest step first

    def __post_init__(self):
        for name in ("row_tokens", "rows_per_step", "attention_width", "open_rows", "balance_rows"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"batching.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def window_steps(self) -> int:
        """Steps per balancing window (balance_rows rounded up to whole steps)."""
        return -(-self.balance_rows // self.rows_per_step)


def check_world_size(rows_per_step: int, world_size: int) -> None:
    """Refuse a world size that cannot split every full step of a packed plan into equal
    shares of rows (`batching.rows_per_step`)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if rows_per_step % world_size:
        fits = [w for w in range(1, rows_per_step + 1) if rows_per_step % w == 0]
        raise ConfigError(
            f"batching.rows_per_step={rows_per_step} is not divisible by the world size "
            f"{world_size}: set rows_per_step to a multiple of {world_size} (e.g. "
            f"{rows_per_step + (-rows_per_step) % world_size}) or train on {fits} workers"
        )


@dataclass(frozen=True, eq=False)
class PackedRows:
    """A packed plan's rows, aligned with its steps and samples (module docstring)."""

    spec: PackingSpec
    row_offsets: np.ndarray  # [R + 1] into the plan's sample_ids
    step_rows: np.ndarray  # [S + 1] into rows
    row_bucket: np.ndarray  # [R] bucket of each row's samples

    @property
    def num_rows(self) -> int:
        return int(self.row_offsets.size - 1)

    @property
    def step_offsets(self) -> np.ndarray:
        """[S + 1] boundaries of each step's samples."""
        return self.row_offsets[self.step_rows]

    @property
    def step_bucket(self) -> np.ndarray:
        """[S] a step's bucket: the bucket of its first row."""
        return self.row_bucket[self.step_rows[:-1]]

    def from_step(self, rel: int) -> PackedRows:
        """The rows of steps [rel, S), their offsets re-based on the first one's samples."""
        r0 = int(self.step_rows[rel])
        return PackedRows(
            spec=self.spec,
            row_offsets=self.row_offsets[r0:] - self.row_offsets[r0],
            step_rows=self.step_rows[rel:] - r0,
            row_bucket=self.row_bucket[r0:],
        )

    def head(self, n: int) -> PackedRows:
        """The rows of the first `n` steps."""
        r = int(self.step_rows[n])
        return PackedRows(
            spec=self.spec,
            row_offsets=self.row_offsets[: r + 1],
            step_rows=self.step_rows[: n + 1],
            row_bucket=self.row_bucket[:r],
        )
