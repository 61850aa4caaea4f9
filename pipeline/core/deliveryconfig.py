"""The `delivery:` config section: how rows reach the ranks (chapters, lead-in, row cache).

`data:` says which data; this section says how it is prepared and served, and never changes
which rows a rank trains at which step (the plan hashes do not depend on it). Imported through
`pipeline.core.config`; longer explanations of each field: docs/config.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from pipeline.core.sections import PATH, _Section

__all__ = [
    "DEFAULT_CHAPTER_TOKENS",
    "DEFAULT_LEAD_TOKENS",
    "DeliveryConfig",
    "MOVED_FROM_DATA",
    "moved_keys_refusal",
    "upgrade_recorded",
]

# 2**28 int32 ids = 1 GiB per chapter: chosen from the read measurement in the docstring of
# pipeline/core/chapters.py (the 902K preset is 4 chapters, about two held at once).
DEFAULT_CHAPTER_TOKENS = 2**28
# The first range of a lead-in: 2**22 int32 ids = 16 MiB, read in seconds (BENCHMARKS.md, "Time
# to the first step").
DEFAULT_LEAD_TOKENS = 2**22

# Keys that were fields of `data:` and now live in `delivery:` under the same name.
MOVED_FROM_DATA = ("chapter_tokens", "chapter_steps", "lead_tokens", "row_cache", "row_cache_dir")


class DeliveryConfig(_Section):
    """How the feeder prepares an epoch's rows and serves them to the ranks."""

    chapter_tokens: PositiveInt | None = Field(
        DEFAULT_CHAPTER_TOKENS,
        description="Most real tokens one chapter holds (2**28 int32 ids = 1 GiB); null: no limit.",
    )
    chapter_steps: PositiveInt | None = Field(
        None, description="Most global steps one chapter holds; null: no limit."
    )
    lead_tokens: PositiveInt | Literal["auto"] | None = Field(
        "auto",
        description="After a start or resume, the first range's real tokens, each next 4x; "
        "auto: 2**22, none with windows; null: none.",
    )
    row_cache: bool | None = Field(
        None,
        description="Decode each row group once into a file on the feeder's node (4 B/token); "
        "null: on, off with windows.",
    )
    row_cache_dir: str | None = Field(
        None,
        json_schema_extra=PATH,
        description="Row cache directory on the driver's node; null: `rows` beside the length index.",
    )

    @model_validator(mode="after")
    def _no_inert_dir(self) -> DeliveryConfig:
        if self.row_cache_dir is not None and not self.row_cache_dir.strip():
            raise ValueError("delivery.row_cache_dir is empty: set a path, or null for the default")
        # A location that nothing will write would otherwise be accepted and silently ignored.
        if self.row_cache_dir is not None and self.row_cache is False:
            raise ValueError(
                "delivery.row_cache_dir has no effect with delivery.row_cache=false: remove it, "
                "or set delivery.row_cache=true"
            )
        return self

    def resolved(self, windowed: bool) -> DeliveryConfig:
        """This section with its defaults decided for a run with or without windows
        (`plan.window_tokens`): the row cache and the lead-in are on for a global plan and off
        for windows, whose row groups are each read once per epoch, by their window's Ray Data
        pass, so the feeder reads no rows. A value set explicitly is kept."""
        cache = (not windowed) if self.row_cache is None else self.row_cache
        lead = self.lead_tokens
        if lead == "auto":
            lead = None if windowed else DEFAULT_LEAD_TOKENS
        return self.model_copy(update={"row_cache": cache, "lead_tokens": lead})


def moved_keys_refusal(raw: object) -> str | None:
    """One line naming each `data.<key>` of `raw` (a whole config) that moved to `delivery:`,
    or None when there is none."""
    data = raw.get("data") if isinstance(raw, dict) else None
    if not isinstance(data, dict):
        return None
    moved = [k for k in MOVED_FROM_DATA if k in data]
    if not moved:
        return None
    where = "; ".join(f"data.{k} moved to delivery.{k}" for k in moved)
    return f"{where}: write {'it' if len(moved) == 1 else 'them'} in the delivery section"


def upgrade_recorded(raw: dict) -> dict:
    """A config recorded in a checkpoint before the delivery section existed, with those keys
    moved there (a copy); a person's config file with them is refused instead."""
    data = raw.get("data")
    if not isinstance(data, dict) or not any(k in data for k in MOVED_FROM_DATA):
        return raw
    delivery = dict(raw.get("delivery") or {})
    delivery.update({k: data[k] for k in MOVED_FROM_DATA if k in data})
    kept = {k: v for k, v in data.items() if k not in MOVED_FROM_DATA}
    return {**raw, "data": kept, "delivery": delivery}
