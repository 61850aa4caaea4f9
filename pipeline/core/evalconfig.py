"""The `eval:` config section: which held-out data a run evaluates, and when.

Imported through `pipeline.core.config`; the evaluation itself is `pipeline.core.evaluation`
(the plan and the figures) and `pipeline.learn.evaluate` (the forward passes).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, PositiveInt, model_validator

from pipeline.core.sections import PATH, ConfigError, _Section

__all__ = ["EvalConfig"]


class EvalConfig(_Section):
    """Held-out evaluation: every held-out sample once per evaluation, summed over all ranks."""

    path: str | None = Field(
        None,
        json_schema_extra=PATH,
        description="Held-out parquet shards, a directory or URI; or eval.split.",
    )
    split: str | None = Field(
        None,
        description="Held-out split beside the training data (e.g. `validation`); or eval.path.",
    )
    every_steps: PositiveInt | None = Field(
        None, description="Evaluate every N GLOBAL steps (null: only at the points below)."
    )
    at_start: bool = Field(False, description="Evaluate the initial model before step 1.")
    at_epoch_end: bool = Field(True, description="Evaluate after the last step of each epoch.")
    at_end: bool = Field(True, description="Evaluate after the run's last step.")
    max_samples: PositiveInt | None = Field(
        None, description="Evaluate a fixed subset of this many held-out samples (null: all)."
    )
    token_budget: PositiveInt | None = Field(
        None,
        description="Padded tokens per evaluation batch, all ranks together; null: the training step's.",
    )
    on_overlap: Literal["error", "drop"] = Field(
        "error",
        description="Held-out samples also in training (same id or tokens): stop, or drop them with a warning.",
    )
    mode: Literal["inline", "async"] = Field(
        "inline",
        description="inline: between training steps; async: a Ray task evaluates each evaluation's checkpoint.",
    )
    reference_run: str | None = Field(
        None,
        json_schema_extra=PATH,
        description="A finished run's directory: each evaluation says where this run stands against it at equal tokens.",
    )

    # The held-out source: one or the other (`--set eval.path=DIR` replaces a config's split).
    exclusive_groups: ClassVar[tuple[frozenset[str], ...]] = (
        frozenset({"path"}),
        frozenset({"split"}),
    )

    @model_validator(mode="after")
    def _one_source_and_a_time(self) -> EvalConfig:
        if (self.path is None) == (self.split is None):
            raise ValueError(
                "eval: give exactly one held-out source: eval.path (parquet shards) or eval.split "
                "(a split beside the training data, e.g. validation)"
            )
        if self.path is not None and not self.path.strip():
            raise ValueError("eval.path is empty: set a directory or URI of parquet shards")
        if not (self.every_steps or self.at_start or self.at_epoch_end or self.at_end):
            raise ValueError(
                "eval: no evaluation would ever run: set eval.every_steps, or one of "
                "eval.at_start / at_epoch_end / at_end to true (or remove the eval section)"
            )
        return self

    def check_reaches(self, total_steps: int) -> None:
        """Refuse (ConfigError) a run of `total_steps` global steps in which no evaluation is
        due: eval.every_steps beyond its end and every eval.at_* false. Known in the validator
        with train.max_steps, else on the driver once the epochs are planned."""
        if self.at_start or self.at_epoch_end or self.at_end:
            return
        if self.every_steps is not None and self.every_steps > total_steps:
            raise ConfigError(
                f"eval: no evaluation would ever run: eval.every_steps={self.every_steps} is "
                f"beyond the run's {total_steps:,} global steps and every eval.at_* is false; "
                f"set eval.every_steps to at most {total_steps:,}, or eval.at_end=true"
            )

    def due(self, before: int, after: int, *, epoch_end: bool, run_end: bool) -> bool:
        """Whether an evaluation follows the optimizer step that took the run from `before` to
        `after` global steps (`epoch_end`/`run_end`: it finished an epoch / the run)."""
        every = self.every_steps
        return (
            (every is not None and after // every > before // every)
            or (epoch_end and self.at_epoch_end)
            or (run_end and self.at_end)
        )
