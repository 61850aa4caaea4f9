"""What model a run trains, as recorded with each of its checkpoints.

A checkpoint holds weights; the architecture they belong to is the model config. Two configs can
give the same parameter names and shapes and still compute different things (a Llama edited
into a Mistral with a sliding window, another `rope_theta`), so a resume under an edited model
config, or an export rebuilt from today's config, would silently train or write another model.
`model_record(cfg.model)` is that config as the run resolved it: for `hf_causal_lm` the full
Hugging Face config (every default filled in, from `model.hf_config` or the `hf_pretrained`
directory's config.json), for the others the `model` section's fields that build the model.
Every checkpoint stores it (`state.json`, "model"); a resume whose record differs is refused
naming the fields (`model_changes`), and `jobs.export_hf` builds from the recorded one.
"""

from __future__ import annotations

import json
from typing import Any

from pipeline.core.config import ModelConfig
from pipeline.learn.factory import hf_config_dict, model_kind

__all__ = [
    "check_same_model",
    "hf_config_from_record",
    "load_weights",
    "model_changes",
    "model_record",
    "resolved_hf_config",
]

# Keys of a Hugging Face config's to_dict() that say how it was saved or run, not what the model
# computes: left out of the record, so they never make two equal models differ.
_NOT_THE_MODEL = frozenset(
    {
        "transformers_version",
        "_name_or_path",
        "architectures",
        "dtype",
        "torch_dtype",
        "_attn_implementation",
        "_attn_implementation_autoset",
        "_commit_hash",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "use_cache",
    }
)
# The model section's fields that build each kind of model (the rest have no effect on it).
_REGISTERED = ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "dropout")
_FACTORY = ("vocab_size", "options")


def _pretrained_config(cfg: ModelConfig) -> dict:
    """config.json of `model.hf_pretrained` (local or s3://), without checking the directory
    (pipeline.learn.pretrained.check_pretrained does that)."""
    from pipeline.learn.pretrained import read_config_json

    return read_config_json(cfg.hf_pretrained)


def resolved_hf_config(cfg: ModelConfig):
    """The `transformers` config an `hf_causal_lm` is built from: `model.hf_config` (vocab_size
    defaulting to model.vocab_size) or the pretrained directory's config.json."""
    from transformers import AutoConfig

    d = _pretrained_config(cfg) if cfg.hf_pretrained is not None else hf_config_dict(cfg.hf_config)
    d = dict(d)
    model_type = d.pop("model_type", None)
    if not model_type:
        raise ValueError("model.hf_config needs a model_type (e.g. llama, gpt2, qwen2)")
    d.setdefault("vocab_size", cfg.vocab_size)
    return AutoConfig.for_model(model_type, **d)


def model_record(cfg: ModelConfig) -> dict:
    """The model as this config builds it (module docstring): plain JSON values."""
    kind = model_kind(cfg.name)
    if kind == "hf":
        d = resolved_hf_config(cfg).to_dict()
        hf = {k: v for k, v in d.items() if k not in _NOT_THE_MODEL}
        return {"name": cfg.name, "hf_config": json.loads(json.dumps(hf, default=str))}
    fields = _FACTORY if kind == "factory" else _REGISTERED
    return {"name": cfg.name, **cfg.model_dump(mode="json", include=set(fields))}


def _flat(d: Any, prefix: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}.{k}"))
    return out


def model_changes(old: dict, new: dict, *, most: int = 6) -> str:
    """The fields in which `new` differs from the recorded `old`, as `model.key: old -> new`
    (nested keys dotted, at most `most` named); empty when they are the same model."""
    a, b = _flat(old, "model"), _flat(new, "model")
    changed = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    shown = [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in changed[:most]]
    more = f" and {len(changed) - most} more" if len(changed) > most else ""
    return ", ".join(shown) + more


def hf_config_from_record(record: dict):
    """The `transformers` config a record holds (for `jobs.export_hf`)."""
    from transformers import AutoConfig

    d = dict(record["hf_config"])
    return AutoConfig.for_model(d.pop("model_type"), **d)


def check_same_model(recorded: dict | None, current: dict, where: str = "") -> None:
    """Refuse to resume weights under another model than the one they were trained as
    (`recorded`: the checkpoint's record, None in a checkpoint older than records)."""
    from pipeline.learn.checkpoint import ResumeError

    if recorded is None:
        return
    changed = model_changes(recorded, current)
    if changed:
        raise ResumeError(
            f"cannot resume: the checkpoint{where} was trained as another model ({changed}); "
            "restore the model config it was trained with, or start a new run with another "
            "checkpoint.run_name"
        )


def load_weights(model, state_dict: dict, where: str = "the checkpoint") -> None:
    """`model.load_state_dict(state_dict)`, with weights that do not fit the model (a size
    mismatch, missing or unexpected parameters) as one ResumeError line instead of torch's
    multi-line RuntimeError: the same on every retry."""
    from pipeline.learn.checkpoint import ResumeError

    try:
        model.load_state_dict(state_dict)
    except RuntimeError as e:
        lines = [ln.strip() for ln in str(e).splitlines()[1:] if ln.strip()]
        detail = "; ".join(lines[:3]) + (f"; and {len(lines) - 3} more" if len(lines) > 3 else "")
        raise ResumeError(
            f"{where}'s weights do not fit the model this config builds ({detail}): use the "
            "model config the checkpoint was trained with"
        ) from None
