"""Run configuration: one strict pydantic tree, loaded from YAML plus `--set a.b=c` overrides."""

from __future__ import annotations

import warnings
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

__all__ = [
    "ConfigError",
    "RunConfig",
    "load_config",
    "apply_overrides",
    "parse_edges",
]

# The team's measured run used these six buckets (DESIGN.md, "Shape").
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
        "seed902k", description="Length distribution (DESIGN.md, seed-calibrated synthetic data)."
    )
    num_samples: PositiveInt = Field(20_000, description="Number of samples to generate.")
    shards: PositiveInt = Field(4, description="Number of parquet shards to write.")
    seed: NonNegativeInt = Field(0, description="Generator seed: same seed, same corpus.")
    out_dir: str = Field(
        "data/synthetic",
        description="Where the corpus is written on first use (relative paths: from the working dir).",
    )


class DataConfig(_Section):
    path: str | None = Field(
        None,
        description="Directory or URI (s3://, gs://, ...) of parquet shards. "
        "Null: use the synthetic corpus described by data.synthetic.",
    )
    synthetic: SyntheticConfig = Field(
        default_factory=SyntheticConfig, description="Synthetic corpus."
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
        description="Samples longer than the top bucket edge: stop with their ids, or truncate them.",
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
    # Chapters (pipeline/core/chapters.py): 2**28 = chapters.DEFAULT_CHAPTER_TOKENS, chosen there.
    chapter_tokens: PositiveInt | None = Field(
        2**28,
        description="Most real tokens one chapter (a run of consecutive global steps read, sorted "
        "and held in the object store together) may hold; 2**28 int32 ids = 1 GiB. Null: no limit.",
    )
    chapter_steps: PositiveInt | None = Field(
        None, description="Most global steps one chapter may hold. Null: no limit."
    )


class BucketsConfig(_Section):
    edges: list[int] | None = Field(
        None,
        description="Explicit bucket edges [0, e1, ..., top]; bucket k holds lengths in (e_k, e_{k+1}]. "
        "Null: optimise them from the data (buckets.num_buckets).",
    )
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

    @field_validator("edges")
    @classmethod
    def _edges_valid(cls, v: list[int] | None) -> list[int] | None:
        if v is None:
            return v
        parse_edges(v)  # raises with a message naming the fix
        return v

    @model_validator(mode="after")
    def _k_in_range(self) -> BucketsConfig:
        if isinstance(self.num_buckets, int) and self.num_buckets > self.max_buckets:
            raise ValueError(
                f"buckets.num_buckets={self.num_buckets} exceeds buckets.max_buckets={self.max_buckets}: "
                "lower num_buckets or raise max_buckets (at most 64)"
            )
        return self


class BatchingConfig(_Section):
    mode: Literal["token_budget", "fixed"] = Field(
        "token_budget",
        description="`token_budget`: a bucket's global batch is token_budget // upper_edge samples; "
        "`fixed`: every global batch has batch_size samples.",
    )
    token_budget: PositiveInt = Field(
        65_536,
        description="Padded tokens per GLOBAL step (all ranks together), so the global batch does not "
        "depend on the world size (contract 8). Per-rank memory ~ token_budget / world_size.",
    )
    batch_size: PositiveInt = Field(32, description="Samples per GLOBAL step in `fixed` mode.")
    round_to: NonNegativeInt = Field(
        8,
        description="Round a token-budget batch size down to a multiple of this (0 or 1: no rounding).",
    )
    pad_to_multiple_of: PositiveInt = Field(
        8,
        description="Padded length is the batch max rounded up to this, never beyond the bucket's upper edge.",
    )
    drop_remainder: bool = Field(
        False,
        description="Drop each bucket's last partial global batch (lossy; off by default, contract 4).",
    )


class PlanConfig(_Section):
    policy: Literal["bucketed", "sorted", "random"] = Field(
        "bucketed",
        description="bucketed: the epoch-seeded bucketed shuffle (this project). Baselines for "
        "comparison: sorted = all samples sorted by length into fixed batches (frozen composition, "
        "batch order reshuffled per epoch); random = one epoch-seeded permutation of all samples. "
        "Both baselines use one bucket up to the top edge.",
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


class TrainConfig(_Section):
    epochs: PositiveInt = Field(1, description="Epochs to train.")
    max_steps: PositiveInt | None = Field(
        None, description="Stop after this many global steps in total (null: all epochs)."
    )
    lr: PositiveFloat = Field(6e-4, description="Peak learning rate.")
    warmup_steps: NonNegativeInt | None = Field(
        None, description="Linear warmup steps (or warmup_ratio)."
    )
    warmup_ratio: Annotated[float, Field(ge=0, le=1)] | None = Field(
        None, description="Warmup as a fraction of total steps (or warmup_steps)."
    )
    schedule: Literal["cosine", "constant"] = Field("cosine", description="Decay after warmup.")
    min_lr_ratio: Annotated[float, Field(ge=0, le=1)] = Field(
        0.1, description="Cosine floor as a fraction of lr."
    )
    weight_decay: NonNegativeFloat = Field(0.1, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW betas.")
    grad_clip: NonNegativeFloat = Field(1.0, description="Max global grad norm (0: no clipping).")
    grad_accum: PositiveInt = Field(1, description="Global steps accumulated per optimizer step.")
    log_every: PositiveInt = Field(10, description="Log metrics every N global steps.")
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
        """Warmup steps for a run of `total_steps` optimizer steps."""
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
    cpus_per_worker: PositiveFloat = Field(
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
        description="Run name; resubmitting with the same name resumes from its latest checkpoint.",
    )
    every_steps: PositiveInt | None = Field(
        200, description="Checkpoint every N global steps (null: only at epoch end)."
    )
    keep_last: PositiveInt = Field(3, description="Checkpoints to keep.")
    max_failures: NonNegativeInt = Field(2, description="Worker-group restarts Ray Train may do.")


class RunConfig(_Section):
    """The whole run. Validated once on the driver, re-validated in each worker."""

    data: DataConfig = Field(default_factory=DataConfig, description="Input data.")
    buckets: BucketsConfig = Field(default_factory=BucketsConfig, description="Length buckets.")
    batching: BatchingConfig = Field(default_factory=BatchingConfig, description="Batch sizing.")
    plan: PlanConfig = Field(default_factory=PlanConfig, description="Epoch plan.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Model.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Optimisation.")
    wandb: WandbConfig = Field(default_factory=WandbConfig, description="Weights & Biases.")
    scaling: ScalingConfig = Field(default_factory=ScalingConfig, description="Workers.")
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Checkpoints."
    )

    @model_validator(mode="after")
    def _cross_checks(self) -> RunConfig:
        edges = self.buckets.edges
        if edges is not None and edges[-1] > self.data.max_length:
            raise ValueError(
                f"buckets.edges top edge {edges[-1]} exceeds data.max_length={self.data.max_length}: "
                "lower the top edge or raise data.max_length"
            )
        return self

    def warn_inert_knobs(self) -> list[str]:
        """Warn about settings that have no effect in the chosen mode; returns the messages."""
        msgs = []
        fields = self.batching.model_fields_set
        if self.batching.mode == "fixed" and "token_budget" in fields:
            msgs.append("batching.token_budget has no effect with batching.mode=fixed")
        if self.batching.mode == "token_budget" and "batch_size" in fields:
            msgs.append("batching.batch_size has no effect with batching.mode=token_budget")
        if self.buckets.edges is not None and "num_buckets" in self.buckets.model_fields_set:
            msgs.append("buckets.num_buckets has no effect when buckets.edges is given")
        if self.scaling.min_workers is not None and self.plan.on_world_size_change == "refuse":
            msgs.append(
                "scaling.min_workers lets Ray Train resize the run, but "
                "plan.on_world_size_change=refuse will stop a resized resume"
            )
        if self.data.path is not None and "synthetic" in self.data.model_fields_set:
            msgs.append("data.synthetic has no effect when data.path is set")
        for m in msgs:
            warnings.warn(m, stacklevel=2)
        return msgs


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
    """Apply `a.b=c` overrides (values parsed as YAML) to a nested dict, returning a new dict."""
    out = _deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set train.lr=3e-4")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        node = out
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"--set {key}: {p} is not a section")
            node = nxt
        node[parts[-1]] = yaml.safe_load(value)
    return out


def _deepcopy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _deepcopy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deepcopy(v) for v in d]
    return d


def _format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field; check the spelling (see configs/local.yaml for every field)"
        elif e["type"] == "missing":
            msg = "required field is missing"
        lines.append(f"{loc}: {msg}" if loc else msg)
    return "invalid config: " + "; ".join(lines)


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
