"""Run configuration: one strict pydantic tree, loaded from YAML plus `--set a.b=c` overrides."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from pipeline.core import overrides as _overrides
from pipeline.core.configerrors import format_validation_error
from pipeline.core.deliveryconfig import DeliveryConfig, moved_keys_refusal
from pipeline.core.evalconfig import EvalConfig
from pipeline.core.modelfields import HF_SWITCH_GROUPS, hf_inert_refusal
from pipeline.core.planconfig import PlanConfig
from pipeline.core.sections import (
    DEFAULT_TOKEN_BUDGET,
    PATH,
    Batching,
    BatchingConfig,
    Buckets,
    BucketsConfig,
    ConfigError,
    DataConfig,
    ExplicitBuckets,
    FixedBatching,
    OnBadRows,
    OptimisedBuckets,
    PackedBatching,
    SyntheticConfig,
    TokenBudgetBatching,
    _Section,
    parse_edges,
)
from pipeline.core.yamlfile import load_yaml_file

__all__ = [
    "DEFAULT_TOKEN_BUDGET",
    "ConfigError",
    "DeliveryConfig",
    "EvalConfig",
    "PlanConfig",
    "RunConfig",
    "DataConfig",
    "SyntheticConfig",
    "OnBadRows",
    "Batching",
    "BatchingConfig",
    "TokenBudgetBatching",
    "FixedBatching",
    "PackedBatching",
    "Buckets",
    "BucketsConfig",
    "ExplicitBuckets",
    "OptimisedBuckets",
    "load_config",
    "apply_overrides",
    "path_fields",
    "parse_edges",
]

# The six bucket edges of the team's measured 902K-sample run (configs/dflash_902k.yaml).
TEAM_EDGES = [0, 770, 1216, 1728, 2432, 3296, 8192]


class ModelConfig(_Section):
    name: str = Field(
        "tiny_decoder",
        description="A registry entry, `hf_causal_lm`, or your own `package.module:factory`.",
    )
    hf_config: str | dict[str, Any] | None = Field(
        None,
        json_schema_extra=PATH,
        description="For hf_causal_lm: a local config.json (or its directory) or an inline dict; never downloaded.",
    )
    hf_pretrained: str | None = Field(
        None,
        json_schema_extra=PATH,
        description="For hf_causal_lm: a save_pretrained directory (safetensors only), local or s3://, to start from.",
    )
    hf_trust_remote_code: bool = Field(
        False,
        description="For hf_pretrained: let the directory's own Python code (auto_map) run.",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Free-form keyword config handed to a `package.module:factory` model.",
    )
    vocab_size: PositiveInt = Field(
        512, description="Vocabulary size; token ids must be < vocab_size."
    )
    d_model: PositiveInt = Field(128, description="Hidden size.")
    n_layers: PositiveInt = Field(2, description="Transformer blocks.")
    n_heads: PositiveInt = Field(4, description="Attention heads; must divide d_model.")
    d_ff: PositiveInt = Field(512, description="MLP hidden size.")
    dropout: Annotated[float, Field(ge=0, lt=1)] = Field(0.0, description="Dropout probability.")

    # `--set model.hf_pretrained=...` drops a built-in model's sizes (inert beside it), and back.
    exclusive_groups: ClassVar[tuple[frozenset[str], ...]] = HF_SWITCH_GROUPS

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        if self.d_model % self.n_heads:
            raise ValueError(
                f"model.n_heads={self.n_heads} must divide model.d_model={self.d_model}: "
                "pick n_heads from the divisors of d_model"
            )
        if self.name == "hf_causal_lm" and self.hf_config is None and self.hf_pretrained is None:
            raise ValueError(
                "model.name=hf_causal_lm needs model.hf_config (a local config.json path or an "
                "inline dict with model_type) or model.hf_pretrained (a save_pretrained directory)"
            )
        if self.hf_pretrained is not None and self.hf_config is not None:
            raise ValueError(
                "model.hf_config has no effect with model.hf_pretrained (its config.json is used): "
                "remove model.hf_config"
            )
        if self.hf_pretrained is not None and self.name != "hf_causal_lm":
            raise ValueError(
                f"model.hf_pretrained has no effect with model.name={self.name!r}: set "
                "model.name=hf_causal_lm, or remove model.hf_pretrained"
            )
        if ":" in self.name and not all(self.name.partition(":")[::2]):
            raise ValueError(f"model.name={self.name!r}: expected 'package.module:factory'")
        if inert := hf_inert_refusal(self):
            raise ValueError(inert)
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
    on_schedule_change: Literal["error", "keep", "recompute"] = Field(
        "error",
        description="A resume whose run length moves the LR schedule: refuse, keep the checkpoint's, or recompute.",
    )
    weight_decay: _FiniteNonNeg = Field(0.1, description="AdamW weight decay (finite, >= 0).")
    betas: tuple[_Beta, _Beta] = Field((0.9, 0.95), description="AdamW betas, each in [0, 1).")
    grad_clip: _FiniteNonNeg = Field(1.0, description="Max global grad norm (0: no clipping).")
    grad_accum: PositiveInt = Field(1, description="GLOBAL steps accumulated per OPTIMIZER step.")
    log_every: PositiveInt = Field(10, description="Log metrics every N GLOBAL steps.")
    bf16: Literal["auto", "on", "off"] = Field(
        "auto", description="bf16 autocast: auto = on for GPU."
    )
    compile: bool = Field(False, description="torch.compile the model's forward (slower start).")
    seed: NonNegativeInt = Field(0, description="Model init / dropout seed.")
    max_nonfinite_steps: NonNegativeInt = Field(
        0,
        description="Optimizer steps in a row with a NaN/inf loss or grad norm skipped before stopping.",
    )
    find_unused_parameters: bool = Field(
        False,
        description="DDP's find_unused_parameters, for a model whose parameters sometimes get no gradient (slower).",
    )
    metrics_file: str | None = Field(
        None,
        json_schema_extra=PATH,
        description="Rank 0 also appends every logged metric as a JSON line here (local disk); null: off.",
    )
    record_sample_ids: str | None = Field(
        None,
        json_schema_extra=PATH,
        description="Directory where each rank records the sample ids it trains (rank<r>.jsonl); null: off.",
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
        description="offline (sync later), online (WANDB_API_KEY in the environment) or disabled.",
    )
    project: str = Field("bucketray", description="W&B project.")
    entity: str | None = Field(None, description="W&B entity (team); null: the key's default.")
    dir: str | None = Field(
        None,
        json_schema_extra=PATH,
        description="Where W&B writes its run folder; null: the run's storage dir.",
    )
    tags: list[str] = Field(default_factory=list, description="W&B tags.")
    init_timeout_s: PositiveFloat = Field(
        30.0,
        description="Seconds wandb.init may take before the run logs offline instead, with a warning.",
    )


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
        description="Elastic: Ray Train may run min_workers to num_workers workers; null: exactly num_workers.",
    )
    resources_per_worker: dict[str, float] = Field(
        default_factory=dict,
        description="Extra Ray resources each worker reserves, e.g. one only some nodes have.",
    )
    autoscaling: bool = Field(
        False,
        description="The cluster grows on demand without publishing its size: skip the driver's fit check.",
    )
    start_retries: Annotated[int, Field(ge=-1)] = Field(
        3,
        description="Times Ray Train retries starting workers that do not fit; -1: forever.",
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
        json_schema_extra=PATH,
        description="Ray Train storage path (local dir or s3://...); checkpoints live under it.",
    )
    run_name: str = Field(
        "bucketray-local",
        description="One directory under storage_path; the same name resumes from its latest checkpoint.",
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
    delivery: DeliveryConfig = Field(
        default_factory=DeliveryConfig, description="How rows reach the ranks."
    )
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
    eval: EvalConfig | None = Field(None, description="Held-out evaluation (null: none).")

    def top_edge_bound(self) -> tuple[int, str]:
        """The largest the top bucket edge can be, and the setting that says so."""
        if self.buckets.edges is not None:
            top = int(self.buckets.edges[-1])
            return top, f"the top edge of buckets.edges ({top})"
        top = int(self.data.max_length)
        return top, f"data.max_length={top} (the top edge of optimised buckets)"

    @property
    def delivery_used(self) -> DeliveryConfig:
        """`delivery` with its defaults decided for this plan (`DeliveryConfig.resolved`)."""
        return self.delivery.resolved(self.plan.window_tokens is not None)

    @model_validator(mode="before")
    @classmethod
    def _no_moved_keys(cls, data: Any) -> Any:
        refusal = moved_keys_refusal(data)
        if refusal:
            raise ValueError(refusal)
        return data

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
        if isinstance(b, PackedBatching):
            _packed_checks(self, top, what)
        if self.eval is not None and self.eval.split is not None:
            _eval_split_checks(self)
        if self.eval is not None and self.train.max_steps is not None:  # epochs: the driver
            self.eval.check_reaches(self.train.max_steps)
        if self.plan.window_tokens is not None and self.delivery.chapter_steps is not None:
            raise ValueError(
                "delivery.chapter_steps has no effect with plan.window_tokens (each window is a "
                "chapter): remove delivery.chapter_steps, or plan.window_tokens"
            )
        if self.delivery.row_cache_dir is not None and not self.delivery_used.row_cache:
            raise ValueError(
                "delivery.row_cache_dir has no effect with plan.window_tokens (the row cache is "
                "off with windows unless asked for): remove it, or set delivery.row_cache=true"
            )
        if self.scaling.min_workers is not None and self.plan.on_world_size_change == "refuse":
            raise ValueError(
                f"scaling.min_workers={self.scaling.min_workers} lets Ray Train resize the run, but "
                "plan.on_world_size_change=refuse stops a resized resume: remove scaling.min_workers "
                "or set plan.on_world_size_change=keep_order"
            )
        return self


def _packed_checks(cfg: RunConfig, top: int, what: str) -> None:
    """batching.mode=packed against the rest of the config: rows hold the longest sample, every
    world size the run may take divides a step's rows, and the plan is the bucketed shuffle."""
    b = cfg.batching
    if b.row_tokens < top:
        raise ValueError(
            f"batching.row_tokens={b.row_tokens} is below {what}: a row must hold one longest "
            f"sample (samples are never split); raise batching.row_tokens to >= {top} or lower "
            "the top edge"
        )
    s = cfg.scaling
    sizes = range(s.min_workers or s.num_workers, s.num_workers + 1)
    bad = [w for w in sizes if b.rows_per_step % w]
    if bad:
        lcm = math.lcm(*sizes)
        fit = -(-b.rows_per_step // lcm) * lcm
        raise ValueError(
            f"batching.rows_per_step={b.rows_per_step} is not divisible by the world size "
            f"{bad[0]} (scaling.num_workers / min_workers): set rows_per_step to a multiple of "
            f"every world size the run may take (e.g. {fit})"
        )
    if cfg.plan.policy != "bucketed":
        raise ValueError(
            f"plan.policy={cfg.plan.policy} plans padded batches, and batching.mode=packed packs "
            "rows from the bucketed shuffle: add batching.mode=token_budget and "
            f"batching.token_budget={b.step_tokens} (a packed step's tokens), "
            "or remove plan.policy"
        )
    if cfg.plan.max_run is not None:
        raise ValueError(
            "plan.max_run has no effect with batching.mode=packed (steps are in an epoch-seeded "
            "order): remove it"
        )


def _eval_split_checks(cfg: RunConfig) -> None:
    """eval.split names held-out files beside the training data, never the training files."""
    split, d = cfg.eval.split, cfg.data
    if d.synthetic is not None:
        if not d.synthetic.heldout:
            raise ValueError(
                f"eval.split={split!r}: the synthetic corpus has no held-out split; set "
                "data.synthetic.heldout (e.g. 0.07) or use eval.path"
            )
        if split != "validation":
            raise ValueError(
                f"eval.split={split!r}: the synthetic corpus holds out split 'validation'"
            )
        return
    # Without data.split, training reads every file of data.path but eval.split's (files of
    # two other splits side by side are refused by discovery), and held-out files trained on
    # are refused by the overlap check.
    if d.split is not None and d.split.lower() == split.lower():
        raise ValueError(
            f"eval.split={split!r} is the training split (data.split): hold out another split, "
            "e.g. validation"
        )


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply `a.b=c` overrides to a nested dict, each value coerced to its field's type
    (pipeline.core.overrides), returning a new dict."""
    try:
        return _overrides.apply_overrides(raw, overrides, RunConfig)
    except _overrides.OverrideError as e:
        raise ConfigError(str(e)) from None


def validate(raw: dict) -> RunConfig:
    """Validate a plain dict into a RunConfig, raising ConfigError with one readable line."""
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e)) from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load YAML (safe_load), apply overrides, validate once."""
    raw: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        loaded = load_yaml_file(p)  # a key written twice, or a tab, is one ConfigError line
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: expected a mapping of sections at top level")
        raw = loaded
    raw = apply_overrides(raw, overrides or [])
    return validate(raw)


def path_fields(cfg: _Section, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, value) of every set field marked PATH, at any depth: the one list of the
    locations a run names (an inline value, e.g. an hf_config dict, is not a location)."""
    found: list[tuple[str, str]] = []
    for name, info in type(cfg).model_fields.items():
        value = getattr(cfg, name)
        key = f"{prefix}{name}"
        if isinstance(value, _Section):
            found += path_fields(value, key + ".")
        elif isinstance(value, str) and (info.json_schema_extra or {}).get("path"):
            found.append((key, value))
    return found
