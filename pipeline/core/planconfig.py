"""The `plan:` config section: which policy orders an epoch, its seed, and its windows.

Imported through `pipeline.core.config`; longer explanations of each field: docs/config.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from pipeline.core.sections import _Section

__all__ = ["PlanConfig", "WINDOWED_POLICIES"]

# Policies whose epoch can be cut into windows of row groups: the sorted baselines and megabatch
# order the whole corpus at once, so a window would change what they are.
WINDOWED_POLICIES = ("bucketed", "random")


class PlanConfig(_Section):
    policy: Literal["bucketed", "sorted", "sorted_ascending", "random", "megabatch"] = Field(
        "bucketed",
        description="`bucketed`: the epoch-seeded bucketed shuffle; or a baseline: sorted, sorted_ascending, random, megabatch.",
    )
    seed: NonNegativeInt = Field(
        0, description="Run seed; epoch orders come from (seed, epoch, bucket)."
    )
    max_run: PositiveInt | None = Field(
        None, description="Cap on consecutive global steps from one bucket (null: no cap)."
    )
    longest_first: bool = Field(
        True,
        description="Put the step with the longest padded batch first, so an OOM shows at step 1.",
    )
    on_world_size_change: Literal["keep_order", "refuse"] = Field(
        "keep_order",
        description="Resumed on another number of workers: keep the same global batches (contract 8), or refuse.",
    )
    window_tokens: PositiveInt | None = Field(
        None,
        description="Shuffle within windows of row groups of about this many real tokens; "
        "null: one window, the global shuffle.",
    )

    @model_validator(mode="after")
    def _windows_fit_the_policy(self) -> PlanConfig:
        if self.window_tokens is not None and self.policy not in WINDOWED_POLICIES:
            raise ValueError(
                f"plan.window_tokens cuts the epoch into windows, and plan.policy={self.policy} "
                "orders the whole corpus at once: remove plan.window_tokens, or use "
                f"plan.policy={' or '.join(WINDOWED_POLICIES)}"
            )
        return self
