"""Run configuration: one strict pydantic tree, loaded from YAML plus `--set a.b=c` overrides."""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    NonNegativeInt,
    PositiveInt,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from pipeline.core import overrides as _overrides

__all__ = [
    "ConfigError",
    "RunConfig",
    "Batching",
    "BatchingConfig",
    "TokenBudgetBatching",
    "FixedBatching",
    "Buckets",
    "BucketsConfig",
    "ExplicitBuckets",
    "OptimisedBuckets",
    "load_config",
    "apply_overrides",
    "parse_edges",
]

# The six bucket edges of the team's measured 902K-sample run (configs/dflash_902k.yaml).
TEAM_EDGES = [0, 770, 1216, 1728, 2432, 3296, 8192]


class ConfigError(ValueError):
    """A configuration problem, phrased as: which field, what is wrong, how to fix it."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class OnBadRows(StrEnum):
    error = "error"
    quarantine = "quarantine"


class SyntheticConfig(_Section):
    preset: Literal["seed902k"] = Field(
        "seed902k", description="Length distribution (pipeline.core.synthetic.PRESETS)."
    )
    num_samples: PositiveInt = Field(20_000, description="Number of samples to generate.")
    shards: PositiveInt = Field(4, description="Number of parquet shards to write.")
    seed: NonNegativeInt = Field(0, description="Generator seed: same seed, same corpus.")
    out_dir: str = Field(
        "data/synthetic",
        description="Where the corpus is written on first use (relative paths: from the working dir).",
    )


_PATH_HINT = "a directory or URI (s3://, gs://, ...) of parquet shards"


class DataConfig(_Section):
    """Input data. The source is exactly one of `path` (your parquet shards) and `synthetic` (the
    generated corpus): the synthetic corpus is used only when its section is given."""

    path: str | None = Field(
        None,
        description=f"Source 1: {_PATH_HINT}. Give this or data.synthetic, never both.",
    )
    synthetic: SyntheticConfig | None = Field(
        None,
        description="Source 2: generate the seed-calibrated synthetic corpus (written on first "
        "use). Give this or data.path, never both.",
    )
    cache_dir: str | None = Field(
        None,
        description="Where the length index is cached; null: beside the data (<path>/_bucketray_index).",
    )
    max_length: PositiveInt = Field(
        8192, description="Longest sample the model accepts, in tokens."
    )
    over_length: Literal["error", "truncate"] = Field(
        "error",
        description="Samples longer than the top bucket edge: stop with their ids, or truncate them "
        "(counted: samples and tokens cut are reported).",
    )
    on_bad_rows: OnBadRows = Field(
        OnBadRows.error,
        description="Bad rows: `error` stops before training naming file, sample id and reason; "
        "`quarantine` writes them to a quarantine parquet and counts them.",
    )
    quarantine_path: str | None = Field(
        None, description="Quarantine parquet path; null: <cache dir>/quarantine.parquet."
    )
    pad_id: NonNegativeInt = Field(0, description="Token id written into padding slots.")

    # The data source: one group or the other (an override of one drops the other's fields).
    exclusive_groups: ClassVar[tuple[frozenset[str], ...]] = (
        frozenset({"path"}),
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
        for name in ("cache_dir", "quarantine_path"):
            v = getattr(self, name)
            if v is not None and not v.strip():
                raise ValueError(f"data.{name} is empty: set a path, or null for the default")
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
        description="Explicit bucket edges [0, e1, ..., top]; bucket k holds lengths in "
        "(e_k, e_{k+1}]. Leave out to optimise the edges from the data instead."
    )

    @model_validator(mode="before")
    @classmethod
    def _no_optimiser_fields(cls, data: Any) -> Any:
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
        description="Number of optimal buckets, or `auto`: the smallest K whose simulated padding "
        "efficiency reaches buckets.target_efficiency.",
    )
    target_efficiency: Annotated[float, Field(gt=0, le=1)] = Field(
        0.97, description="Padding efficiency (real / padded tokens) that `auto` aims for."
    )
    max_buckets: Annotated[int, Field(ge=1, le=64)] = Field(
        64, description="Upper bound on K for `auto`, and on any K."
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


class _Batching(_Section):
    pad_to_multiple_of: PositiveInt = Field(
        8,
        description="Padded length is the batch max rounded up to this, never beyond the bucket's upper edge.",
    )
    drop_remainder: bool = Field(
        False,
        description="Drop each bucket's last partial global batch (lossy; off by default, contract 4).",
    )


class TokenBudgetBatching(_Batching):
    """A bucket's global batch holds token_budget // (its upper edge) samples."""

    mode: Literal["token_budget"] = Field(
        "token_budget",
        description="`token_budget` (this section's fields) or `fixed` (batch_size instead).",
    )
    token_budget: PositiveInt = Field(
        65_536,
        description="Padded tokens per GLOBAL step (all ranks together), so the global batch does not "
        "depend on the world size (contract 8); per-rank memory ~ token_budget / world_size. "
        "At least the top bucket edge.",
    )
    round_to: NonNegativeInt = Field(
        8,
        description="Round a token-budget batch size down to a multiple of this (0 or 1: no rounding).",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_fixed_fields(cls, data: Any) -> Any:
        why = "with batching.mode=token_budget: remove it, or set batching.mode=fixed"
        return _forbid("batching", data, {"batch_size": why})


class FixedBatching(_Batching):
    """Every global batch has batch_size samples."""

    mode: Literal["fixed"] = Field(
        "fixed", description="`fixed` (batch_size) or `token_budget` (token_budget, round_to)."
    )
    batch_size: PositiveInt = Field(32, description="Samples per GLOBAL step (all ranks together).")

    @model_validator(mode="before")
    @classmethod
    def _no_budget_fields(cls, data: Any) -> Any:
        why = "with batching.mode=fixed: remove it, or set batching.mode=token_budget"
        return _forbid("batching", data, {"token_budget": why, "round_to": why})


def _batching_mode(v: Any) -> str:
    return str(v.get("mode", "token_budget")) if isinstance(v, dict) else v.mode


Batching = Annotated[
    Annotated[TokenBudgetBatching, Tag("token_budget")] | Annotated[FixedBatching, Tag("fixed")],
    Discriminator(_batching_mode),
]
_BATCHING = TypeAdapter(Batching)


def BatchingConfig(**fields: Any) -> TokenBudgetBatching | FixedBatching:  # noqa: N802
    """The batching section its `mode` names (default token_budget), validated."""
    return _BATCHING.validate_python(fields)


class PlanConfig(_Section):
    policy: Literal["bucketed", "sorted", "random"] = Field(
        "bucketed",
        description="bucketed: the epoch-seeded bucketed shuffle (this project). Baselines for "
        "comparison: sorted = a static plan, all samples sorted by length and cut into batches, "
        "the same batches in the same order every epoch (plan.longest_first moves the longest "
        "to the front); random = one epoch-seeded permutation of all samples. Both baselines use "
        "one bucket up to the top edge.",
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
        description="Resuming with another number of workers: keep the same global batches "
        "(contract 8) or refuse with an error.",
    )


class ModelConfig(_Section):
    name: str = Field(
        "tiny_decoder", description="Model registry entry (pipeline.learn.model.MODELS)."
    )
    vocab_size: PositiveInt = Field(
        512, description="Vocabulary size; token ids must be < vocab_size."
    )
    d_model: PositiveInt = Field(128, description="Hidden size.")
    n_layers: PositiveInt = Field(2, description="Transformer blocks.")
    n_heads: PositiveInt = Field(4, description="Attention heads; must divide d_model.")
    d_ff: PositiveInt = Field(512, description="MLP hidden size.")
    dropout: Annotated[float, Field(ge=0, lt=1)] = Field(0.0, description="Dropout probability.")

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        if self.d_model % self.n_heads:
            raise ValueError(
                f"model.n_heads={self.n_heads} must divide model.d_model={self.d_model}: "
                "pick n_heads from the divisors of d_model"
            )
        return self


# Finite floats: `.inf` or `.nan` in a config is a mistake, never a setting.
_FiniteNonNeg = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_Beta = Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)]


class TrainConfig(_Section):
    """Optimisation. Units: a GLOBAL step is one step of the epoch plan (every rank trains one
    micro-batch); an OPTIMIZER step is `grad_accum` global steps (never spanning two epochs).
    pipeline.core.runlength.run_length converts between them."""

    epochs: PositiveInt = Field(1, description="Epochs to train.")
    max_steps: PositiveInt | None = Field(
        None, description="Stop after this many GLOBAL steps in total (null: all epochs)."
    )
    lr: Annotated[float, Field(gt=0, allow_inf_nan=False)] = Field(
        6e-4, description="Peak learning rate (finite, > 0)."
    )
    warmup_steps: NonNegativeInt | None = Field(
        None, description="Linear warmup, in OPTIMIZER steps (or warmup_ratio)."
    )
    warmup_ratio: Annotated[float, Field(ge=0, le=1)] | None = Field(
        None, description="Warmup as a fraction of the run's OPTIMIZER steps (or warmup_steps)."
    )
    schedule: Literal["cosine", "constant"] = Field("cosine", description="Decay after warmup.")
    min_lr_ratio: Annotated[float, Field(ge=0, le=1)] = Field(
        0.1, description="Cosine floor as a fraction of lr."
    )
    weight_decay: _FiniteNonNeg = Field(0.1, description="AdamW weight decay (finite, >= 0).")
    betas: tuple[_Beta, _Beta] = Field((0.9, 0.95), description="AdamW betas, each in [0, 1).")
    grad_clip: _FiniteNonNeg = Field(1.0, description="Max global grad norm (0: no clipping).")
    grad_accum: PositiveInt = Field(1, description="GLOBAL steps accumulated per OPTIMIZER step.")
    log_every: PositiveInt = Field(10, description="Log metrics every N GLOBAL steps.")
    bf16: Literal["auto", "on", "off"] = Field(
        "auto", description="bf16 autocast: auto = on for GPU."
    )
    seed: NonNegativeInt = Field(0, description="Model init / dropout seed.")
    metrics_file: str | None = Field(
        None,
        description="Rank 0 also appends every logged metric as one JSON line to this file, on its "
        "node's local disk (null: W&B only).",
    )
    record_sample_ids: str | None = Field(
        None,
        description="Directory where every rank appends the sample ids of each micro-batch it trains "
        "(rank<r>.jsonl, on its node's local disk), to check determinism and exact resume; null: off.",
    )

    @model_validator(mode="after")
    def _one_warmup(self) -> TrainConfig:
        if self.warmup_steps is not None and self.warmup_ratio is not None:
            raise ValueError(
                "train.warmup_steps and train.warmup_ratio are both set: choose one, set the other to null"
            )
        return self

    def warmup_for(self, total_steps: int) -> int:
        """Warmup optimizer steps for a run of `total_steps` optimizer steps."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        if self.warmup_ratio is not None:
            return int(round(self.warmup_ratio * total_steps))
        return 0


class WandbConfig(_Section):
    mode: Literal["offline", "online", "disabled"] = Field(
        "offline",
        description="offline: local run folder (`wandb sync` later); online needs WANDB_API_KEY in the "
        "environment; disabled: no W&B at all. Keys never belong in this file.",
    )
    project: str = Field("bucketray", description="W&B project.")
    entity: str | None = Field(None, description="W&B entity (team); null: the key's default.")
    dir: str | None = Field(
        None, description="Where W&B writes its run folder; null: the run's storage dir."
    )
    tags: list[str] = Field(default_factory=list, description="W&B tags.")


class ScalingConfig(_Section):
    num_workers: PositiveInt = Field(2, description="Ray Train workers (ranks).")
    use_gpu: bool = Field(
        False, description="One GPU per worker, NCCL; else CPU workers with gloo."
    )
    cpus_per_worker: Annotated[float, Field(gt=0, allow_inf_nan=False)] = Field(
        1.0, description="CPUs reserved per worker (fractions allowed)."
    )
    min_workers: PositiveInt | None = Field(
        None,
        description="Elastic training: Ray Train may (re)start the run with between min_workers "
        "and num_workers workers, e.g. after losing a node; the global batches stay the same "
        "(contract 8). Null: exactly num_workers, and a lost node makes the run wait for capacity.",
    )
    resources_per_worker: dict[str, float] = Field(
        default_factory=dict,
        description="Extra Ray resources each worker reserves besides CPU/GPU, e.g. a custom "
        "resource that only certain nodes have.",
    )

    @model_validator(mode="after")
    def _elastic_range(self) -> ScalingConfig:
        if self.min_workers is not None and self.min_workers > self.num_workers:
            raise ValueError(
                f"scaling.min_workers={self.min_workers} exceeds scaling.num_workers="
                f"{self.num_workers}: lower min_workers or raise num_workers"
            )
        return self

    def ray_num_workers(self) -> int | tuple[int, int]:
        """What ray.train.ScalingConfig takes: a count, or an elastic (min, max) range."""
        if self.min_workers is None or self.min_workers == self.num_workers:
            return self.num_workers
        return (self.min_workers, self.num_workers)


class CheckpointConfig(_Section):
    storage_path: str = Field(
        "runs",
        description="Ray Train storage path (local dir or s3://...); checkpoints live under it.",
    )
    run_name: str = Field(
        "bucketray-local",
        description="Run name, one directory under storage_path (letters, digits, '.', '_', '-'; "
        "starting with a letter or digit); resubmitting with the same name resumes from its "
        "latest checkpoint.",
    )
    every_steps: PositiveInt | None = Field(
        200, description="Checkpoint every N GLOBAL steps (null: only at epoch end)."
    )
    keep_last: PositiveInt = Field(3, description="Checkpoints to keep.")
    max_failures: NonNegativeInt = Field(2, description="Worker-group restarts Ray Train may do.")

    @field_validator("run_name")
    @classmethod
    def _one_path_component(cls, v: str) -> str:
        if not _RUN_NAME.fullmatch(v):
            raise ValueError(
                f"checkpoint.run_name={v!r} must be one directory name: letters, digits, '.', '_' "
                "or '-', starting with a letter or digit, at most 128 characters (e.g. dflash-902k)"
            )
        return v


_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class RunConfig(_Section):
    """The whole run. Validated once on the driver, re-validated in each worker."""

    data: DataConfig = Field(description="Input data (data.path or data.synthetic).")
    buckets: Buckets = Field(
        default_factory=OptimisedBuckets, description="Length buckets: edges, or optimised."
    )
    batching: Batching = Field(
        default_factory=TokenBudgetBatching, description="Batch sizing: token_budget or fixed."
    )
    plan: PlanConfig = Field(default_factory=PlanConfig, description="Epoch plan.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Model.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Optimisation.")
    wandb: WandbConfig = Field(default_factory=WandbConfig, description="Weights & Biases.")
    scaling: ScalingConfig = Field(default_factory=ScalingConfig, description="Workers.")
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Checkpoints."
    )

    def top_edge_bound(self) -> tuple[int, str]:
        """The largest the top bucket edge can be, and the setting that says so."""
        if self.buckets.edges is not None:
            top = int(self.buckets.edges[-1])
            return top, f"the top edge of buckets.edges ({top})"
        top = int(self.data.max_length)
        return top, f"data.max_length={top} (the top edge of optimised buckets)"

    @model_validator(mode="after")
    def _cross_checks(self) -> RunConfig:
        edges = self.buckets.edges
        if edges is not None and edges[-1] > self.data.max_length:
            raise ValueError(
                f"buckets.edges top edge {edges[-1]} exceeds data.max_length={self.data.max_length}: "
                "lower the top edge or raise data.max_length"
            )
        top, what = self.top_edge_bound()
        b = self.batching
        if isinstance(b, TokenBudgetBatching) and b.token_budget < top:
            raise ValueError(
                f"batching.token_budget={b.token_budget} is below {what}: a global batch must "
                f"hold one longest sample; raise batching.token_budget to >= {top} or lower the "
                "top edge"
            )
        if self.scaling.min_workers is not None and self.plan.on_world_size_change == "refuse":
            raise ValueError(
                f"scaling.min_workers={self.scaling.min_workers} lets Ray Train resize the run, but "
                "plan.on_world_size_change=refuse stops a resized resume: remove scaling.min_workers "
                "or set plan.on_world_size_change=keep_order"
            )
        return self


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


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply `a.b=c` overrides to a nested dict, each value coerced to its field's type
    (pipeline.core.overrides), returning a new dict."""
    try:
        return _overrides.apply_overrides(raw, overrides, RunConfig)
    except _overrides.OverrideError as e:
        raise ConfigError(str(e)) from None


# Tags of the discriminated sections' variants: pydantic puts them in error locations.
_VARIANT_TAGS = {"buckets": {"explicit", "optimised"}, "batching": {"token_budget", "fixed"}}


_RANGE_ERRORS = {
    "finite_number",
    "greater_than",
    "greater_than_equal",
    "less_than",
    "less_than_equal",
    "int_parsing",
    "int_from_float",
    "float_parsing",
    "literal_error",
    "bool_parsing",
}


def _error_line(e: dict) -> str:
    parts = [str(p) for p in e["loc"]]
    if len(parts) > 1 and parts[1] in _VARIANT_TAGS.get(parts[0], ()):
        parts.pop(1)
    loc = ".".join(parts)
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "extra_forbidden":
        msg = "unknown field; check the spelling (see configs/local.yaml for every field)"
    elif e["type"] == "missing" and loc == "data":
        msg = "required section is missing: give data.path or a data.synthetic section"
    elif e["type"] == "missing":
        msg = "required field is missing"
    elif e["type"] == "union_tag_invalid":
        tags = e["ctx"]["expected_tags"]
        return f"{loc}.mode={e['ctx']['tag']!r} is not a mode: choose one of {tags}"
    if parts and msg.startswith(tuple(f"{parts[0]}{c}" for c in ".: ")):
        return msg  # the message already names its field
    if e["type"] in _RANGE_ERRORS:
        msg = f"{msg}, got {e['input']!r}"
    return f"{loc}: {msg}" if loc else msg


def _format_validation_error(err: ValidationError) -> str:
    return "invalid config: " + "; ".join(_error_line(e) for e in err.errors())


def validate(raw: dict) -> RunConfig:
    """Validate a plain dict into a RunConfig, raising ConfigError with one readable line."""
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e)) from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load YAML (safe_load), apply overrides, validate once."""
    raw: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        loaded = yaml.safe_load(p.read_text())
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: expected a mapping of sections at top level")
        raw = loaded
    raw = apply_overrides(raw, overrides or [])
    return validate(raw)
