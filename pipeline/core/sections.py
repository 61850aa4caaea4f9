"""The config sections with variants or shared pieces: the data source (a path or the synthetic
corpus), the buckets (explicit edges or optimised) and the batching (token budget or fixed).

A field of the other variant is a one-line error naming it and the fix, never a silent no-op.
Imported through `pipeline.core.config`, which assembles the whole RunConfig.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    NonNegativeInt,
    PositiveInt,
    Tag,
    TypeAdapter,
    field_validator,
    model_validator,
)

__all__ = [
    "DEFAULT_TOKEN_BUDGET",
    "ConfigError",
    "OnBadRows",
    "SyntheticConfig",
    "DataConfig",
    "ExplicitBuckets",
    "OptimisedBuckets",
    "Buckets",
    "BucketsConfig",
    "TokenBudgetBatching",
    "FixedBatching",
    "PackedBatching",
    "Batching",
    "BatchingConfig",
    "parse_edges",
    "PATH",
]

# Marks a field that names a file, directory or URI: the rules for locations
# (pipeline.core.config.path_fields, and the refusal of relative paths inside a submitted job)
# find them by this mark, not by a list kept elsewhere.
PATH: dict[str, Any] = {"path": True}


class ConfigError(ValueError):
    """A configuration problem, phrased as: which field, what is wrong, how to fix it."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class OnBadRows(StrEnum):
    error = "error"
    quarantine = "quarantine"


class SyntheticConfig(_Section):
    preset: Literal["seed902k", "pystdlib"] = Field(
        "seed902k",
        description="seed902k: the seed-calibrated synthetic lengths; pystdlib: this Python's standard library as byte-token text.",
    )
    num_samples: PositiveInt = Field(
        20_000,
        description="Samples to generate (pystdlib: at most this many definitions, drawn with seed).",
    )
    shards: PositiveInt = Field(4, description="Parquet shards to write.")
    seed: NonNegativeInt = Field(
        0, description="Generator seed (pystdlib: which subset); same seed, same corpus."
    )
    out_dir: str = Field(
        "data/synthetic",
        json_schema_extra=PATH,
        description="Where the corpus is written on first use.",
    )
    heldout: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.0,
        description="Fraction held out as split `validation` (training reads `train`); 0: none.",
    )


_PATH_HINT = "a directory or URI (s3://, gs://, ...) of parquet shards"


class DataConfig(_Section):
    """Input data. The source is exactly one of `path` (your parquet shards) and `synthetic` (the
    generated corpus): the synthetic corpus is used only when its section is given."""

    path: str | None = Field(
        None,
        json_schema_extra=PATH,
        description="Source 1: a directory or URI (s3://, gs://, ...) of parquet shards; or data.synthetic.",
    )
    synthetic: SyntheticConfig | None = Field(
        None,
        description="Source 2: a corpus generated on first use; or data.path.",
    )
    glob: str | None = Field(
        None,
        description="With data.path: shard files, a pattern relative to it (`**` across folders); null: the files directly in it.",
    )
    split: str | None = Field(
        None,
        description="With data.path: keep only this split's files (e.g. `train`); null: any file.",
    )
    cache_dir: str | None = Field(
        None,
        json_schema_extra=PATH,
        description="Where the length index is cached; null: <path>/_bucketray_index.",
    )
    max_length: PositiveInt = Field(
        8192, description="Longest sample the model accepts, in tokens."
    )
    over_length: Literal["error", "truncate"] = Field(
        "error",
        description="Samples over the top bucket edge: stop naming them, or truncate them (counted).",
    )
    on_bad_rows: OnBadRows = Field(
        OnBadRows.error,
        description="Bad rows: `error` stops naming file, sample id and reason; `quarantine` sets them aside, counted.",
    )
    quarantine_path: str | None = Field(
        None,
        json_schema_extra=PATH,
        description="Quarantine parquet path; null: <cache dir>/quarantine.parquet.",
    )
    pad_id: NonNegativeInt = Field(0, description="Token id written into padding slots.")

    # The data source: one group or the other (an override of one drops the other's fields).
    exclusive_groups: ClassVar[tuple[frozenset[str], ...]] = (
        frozenset({"path", "glob", "split"}),
        frozenset({"synthetic"}),
    )

    @model_validator(mode="after")
    def _one_source(self) -> DataConfig:
        if self.path is not None and not self.path.strip():
            raise ValueError(
                f"data.path is empty: set it to {_PATH_HINT} (an unset shell variable?), "
                "or remove it and add a data.synthetic section for the synthetic corpus"
            )
        if self.path is not None and self.synthetic is not None:
            raise ValueError(
                "data.synthetic has no effect when data.path is set: remove data.synthetic, "
                "or remove data.path to train on the synthetic corpus"
            )
        if self.path is None and self.synthetic is None:
            raise ValueError(
                f"data: no data source: set data.path to {_PATH_HINT}, or add a data.synthetic "
                "section (e.g. `synthetic: {}`) to train on the synthetic corpus"
            )
        if self.path is None and (self.glob is not None or self.split is not None):
            raise ValueError(
                "data.glob and data.split select files under data.path and have no effect on the "
                "synthetic corpus: remove them, or set data.path"
            )
        for name in ("cache_dir", "quarantine_path"):
            v = getattr(self, name)
            if v is not None and not v.strip():
                raise ValueError(f"data.{name} is empty: set a path, or null for the default")
        return self

    @model_validator(mode="after")
    def _no_inert_paths(self) -> DataConfig:
        # A location that nothing will write would otherwise be accepted and silently ignored.
        if self.quarantine_path is not None and self.on_bad_rows == OnBadRows.error:
            raise ValueError(
                "data.quarantine_path has no effect with data.on_bad_rows=error (bad rows stop "
                "the run, nothing is quarantined): remove it, or set data.on_bad_rows=quarantine"
            )
        return self


def _forbid(section: str, data: Any, fields: dict[str, str]) -> Any:
    """Refuse, in one line, a field that belongs to another variant of a section."""
    if isinstance(data, dict):
        for name, why in fields.items():
            if name in data:
                raise ValueError(f"{section}.{name} has no effect {why}")
    return data


class ExplicitBuckets(_Section):
    """Bucket edges given in the config."""

    edges: list[int] = Field(
        description="Explicit edges [0, e1, ..., top]; bucket k holds lengths in (e_k, e_{k+1}]. Leave out to optimise."
    )

    @model_validator(mode="before")
    @classmethod
    def _no_optimiser_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("edges", 0) is None:
            raise ValueError(
                "buckets.edges is null: leave it out to optimise the edges (buckets.num_buckets), "
                "or give them as [0, e1, ..., top]"
            )
        why = (
            "when buckets.edges is given: remove it, or remove buckets.edges to optimise the edges"
        )
        return _forbid("buckets", data, dict.fromkeys(OptimisedBuckets.model_fields, why))

    @field_validator("edges")
    @classmethod
    def _edges_valid(cls, v: list[int]) -> list[int]:
        parse_edges(v)  # raises with a message naming the fix
        return v


class OptimisedBuckets(_Section):
    """Bucket edges optimised from the data's lengths (no `edges` given)."""

    num_buckets: PositiveInt | Literal["auto"] = Field(
        "auto",
        description="Number of optimal buckets, or `auto`: the smallest K reaching target_efficiency.",
    )
    target_efficiency: Annotated[float, Field(gt=0, le=1)] = Field(
        0.97, description="Padding efficiency (real / padded tokens) that `auto` aims for."
    )
    max_buckets: Annotated[int, Field(ge=1, le=64)] = Field(
        64, description="Upper bound on K for `auto`, and on any K."
    )
    max_recomposition_floor: Annotated[float, Field(ge=0, le=1)] | None = Field(
        None,
        description="`auto` only: ceiling on the chance of re-pairing the last epoch's samples; null: none.",
    )

    @property
    def edges(self) -> None:
        """None: the edges are optimised from the data (see pipeline.core.epochs.resolve_edges)."""
        return None

    @model_validator(mode="after")
    def _k_in_range(self) -> OptimisedBuckets:
        if isinstance(self.num_buckets, int) and self.num_buckets > self.max_buckets:
            raise ValueError(
                f"buckets.num_buckets={self.num_buckets} exceeds buckets.max_buckets={self.max_buckets}: "
                "lower num_buckets or raise max_buckets (at most 64)"
            )
        return self


def _buckets_kind(v: Any) -> str:
    has_edges = "edges" in v if isinstance(v, dict) else isinstance(v, ExplicitBuckets)
    return "explicit" if has_edges else "optimised"


Buckets = Annotated[
    Annotated[ExplicitBuckets, Tag("explicit")] | Annotated[OptimisedBuckets, Tag("optimised")],
    Discriminator(_buckets_kind),
]
_BUCKETS = TypeAdapter(Buckets)


def BucketsConfig(**fields: Any) -> ExplicitBuckets | OptimisedBuckets:  # noqa: N802
    """The buckets section: explicit when `edges` is given, else optimised (validated)."""
    return _BUCKETS.validate_python(fields)


# batching.token_budget's default: padded tokens per global step.
DEFAULT_TOKEN_BUDGET = 65_536


class _Batching(_Section):
    pad_to_multiple_of: PositiveInt = Field(
        8,
        description="Round the padded length up to this, never beyond the bucket's upper edge.",
    )
    drop_remainder: bool = Field(
        False,
        description="Drop each bucket's last partial global batch (lossy; contract 4).",
    )


class TokenBudgetBatching(_Batching):
    """Global batches hold at most token_budget padded tokens (batching.fill says how they are cut)."""

    mode: Literal["token_budget"] = Field(
        "token_budget",
        description="`token_budget`, `fixed` (batch_size) or `packed` (rows of whole samples).",
    )
    token_budget: PositiveInt = Field(
        DEFAULT_TOKEN_BUDGET,
        description="Padded tokens per GLOBAL step, all ranks together (contract 8); at least the top bucket edge.",
    )
    fill: Literal["greedy", "fixed_per_bucket"] = Field(
        "greedy",
        description="`greedy`: fill each global batch up to the budget; `fixed_per_bucket`: budget // upper edge samples.",
    )
    round_to: NonNegativeInt | None = Field(
        None,
        description="Round batch sizes down to a multiple of this (0 or 1: no; null: 8 for fixed_per_bucket).",
    )

    @property
    def step_tokens(self) -> int:
        """Padded tokens per global step at most: the budget."""
        return self.token_budget

    @model_validator(mode="before")
    @classmethod
    def _no_fixed_fields(cls, data: Any) -> Any:
        why = "with batching.mode=token_budget: remove it, or set batching.mode=fixed"
        data = _forbid("batching", data, {"batch_size": why})
        return _forbid("batching", data, dict.fromkeys(_PACKED_ONLY, _PACKED_WHY))


class FixedBatching(_Batching):
    """Every global batch has batch_size samples."""

    mode: Literal["fixed"] = Field(
        "fixed",
        description="`fixed` (batch_size), `token_budget` or `packed`.",
    )
    batch_size: PositiveInt = Field(32, description="Samples per GLOBAL step (all ranks together).")

    @model_validator(mode="before")
    @classmethod
    def _no_budget_fields(cls, data: Any) -> Any:
        why = "with batching.mode=fixed: remove it, or set batching.mode=token_budget"
        data = _forbid("batching", data, {"token_budget": why, "round_to": why, "fill": why})
        return _forbid("batching", data, dict.fromkeys(_PACKED_ONLY, _PACKED_WHY))


_PACKED_ONLY = ("row_tokens", "rows_per_step", "open_rows", "balance_rows", "attention_width")
_PACKED_WHY = "outside batching.mode=packed: remove it, or set batching.mode=packed"


class PackedBatching(_Batching):
    """Padding-free: whole samples packed into rows of row_tokens tokens, each document attending
    only to itself (pipeline.core.packing); rows_per_step rows per global step, balanced across
    ranks under the cost model declared in pipeline/core/packing.py."""

    mode: Literal["packed"] = Field(
        "packed",
        description="`packed`: rows of whole samples, each attending only to itself; or `token_budget`, `fixed`.",
    )
    row_tokens: PositiveInt = Field(
        8192,
        description="Tokens per row: a multiple of pad_to_multiple_of, at least the top bucket edge.",
    )
    rows_per_step: PositiveInt = Field(
        8,
        description="Rows per GLOBAL step, all ranks together; every world size the run may take divides it.",
    )
    open_rows: PositiveInt = Field(
        16,
        description="Rows open at once while packing a bucket (more: fuller rows, packing less local).",
    )
    balance_rows: PositiveInt = Field(
        512,
        description="Rows sorted by cost together before being cut into rank-balanced steps.",
    )
    attention_width: PositiveInt | None = Field(
        None,
        description="Cost model's attention width (a row costs row_tokens + sum(L^2) / width); null: 6 x d_model.",
    )

    @property
    def step_tokens(self) -> int:
        """Tokens per global step: its rows, full or not."""
        return self.rows_per_step * self.row_tokens

    @model_validator(mode="before")
    @classmethod
    def _no_padded_fields(cls, data: Any) -> Any:
        why = "with batching.mode=packed: remove it (rows_per_step and row_tokens size a step)"
        return _forbid(
            "batching",
            data,
            {"token_budget": why, "round_to": why, "fill": why, "batch_size": why},
        )

    @model_validator(mode="after")
    def _row_multiple(self) -> PackedBatching:
        if self.row_tokens % self.pad_to_multiple_of:
            up = -(-self.row_tokens // self.pad_to_multiple_of) * self.pad_to_multiple_of
            raise ValueError(
                f"batching.row_tokens={self.row_tokens} is not a multiple of "
                f"batching.pad_to_multiple_of={self.pad_to_multiple_of}: set row_tokens to {up}"
            )
        if self.drop_remainder:
            raise ValueError(
                "batching.drop_remainder has no effect with batching.mode=packed (the last step "
                "trains the remaining rows): remove it"
            )
        return self


def _batching_mode(v: Any) -> str:
    return str(v.get("mode", "token_budget")) if isinstance(v, dict) else v.mode


Batching = Annotated[
    Annotated[TokenBudgetBatching, Tag("token_budget")]
    | Annotated[FixedBatching, Tag("fixed")]
    | Annotated[PackedBatching, Tag("packed")],
    Discriminator(_batching_mode),
]
_BATCHING = TypeAdapter(Batching)


def BatchingConfig(**fields: Any) -> TokenBudgetBatching | FixedBatching | PackedBatching:  # noqa: N802
    """The batching section its `mode` names (default token_budget), validated."""
    return _BATCHING.validate_python(fields)


def parse_edges(edges: Any) -> list[int]:
    """Validate bucket edges: [0, e1, ..., top], integers, strictly increasing, at least one bucket."""
    if isinstance(edges, str):
        try:
            edges = [int(x) for x in edges.replace(" ", "").strip("[]").split(",") if x]
        except ValueError as e:
            raise ConfigError(
                f"buckets.edges must be comma-separated integers: got {edges!r}"
            ) from e
    edges = list(edges)
    if len(edges) < 2:
        raise ConfigError(f"buckets.edges needs at least two values [0, top]: got {edges}")
    if any(int(e) != e for e in edges):
        raise ConfigError(f"buckets.edges must be integers: got {edges}")
    edges = [int(e) for e in edges]
    if edges[0] != 0:
        raise ConfigError(f"buckets.edges must start at 0: got {edges}; prepend 0")
    if any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
        raise ConfigError(f"buckets.edges must be strictly increasing: got {edges}")
    return edges
