"""What a model config's fields mean for the model it names: the built-in model's size fields
are inert beside a Hugging Face model (its config says its sizes), so a value other than the
default there is refused rather than ignored; and the model's width, which the packing cost
model's default attention width is made from, is read from where the model takes it.

Pure: a local `config.json` is read with the standard library; a remote one (`s3://...`) is not
read here, and the cost model then asks for `batching.attention_width`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.core.sections import ConfigError

__all__ = ["HF_INERT_FIELDS", "HF_SWITCH_GROUPS", "hf_inert_refusal", "model_width"]

# The built-in decoder's sizes: a Hugging Face model builds from model.hf_config instead.
HF_INERT_FIELDS = ("d_model", "n_layers", "n_heads", "d_ff", "dropout")
HF_SWITCH_GROUPS = (frozenset({"hf_config", "hf_pretrained"}), frozenset(HF_INERT_FIELDS))
# Where a Hugging Face config keeps the hidden size (llama/qwen/mistral, gpt2, t5-style).
_WIDTH_KEYS = ("hidden_size", "n_embd", "d_model")


def hf_inert_refusal(model: Any) -> str | None:
    """The one-line refusal of built-in size fields set beside model.name=hf_causal_lm, or None.
    Fields at their defaults (a copied demo config) say nothing and pass."""
    if model.name != "hf_causal_lm":
        return None
    fields = type(model).model_fields
    set_ = [f for f in HF_INERT_FIELDS if getattr(model, f) != fields[f].default]
    if not set_:
        return None
    named = ", ".join(f"model.{f}={getattr(model, f)}" for f in set_)
    return (
        f"{named} {'has' if len(set_) == 1 else 'have'} no effect with model.name=hf_causal_lm "
        "(its sizes come from model.hf_config or model.hf_pretrained's config.json: "
        "hidden_size, num_hidden_layers, ...): remove "
        f"{'it' if len(set_) == 1 else 'them'}, and set the sizes in the Hugging Face config"
    )


def _hf_config(model: Any) -> tuple[dict | None, str]:
    """(the Hugging Face config as a dict, or None when it cannot be read here; where it is)."""
    spec = model.hf_config if model.hf_pretrained is None else model.hf_pretrained
    field = "model.hf_config" if model.hf_pretrained is None else "model.hf_pretrained"
    if isinstance(spec, dict):
        return spec, field
    where = f"{field}={spec}"
    if spec is None or "://" in str(spec):
        return None, where
    p = Path(str(spec)).expanduser()
    p = p / "config.json" if p.is_dir() else p
    try:
        return json.loads(p.read_text()), where
    except (OSError, ValueError):
        return None, where


def model_width(model: Any) -> int:
    """The model's hidden size: model.d_model for the built-in models, the Hugging Face config's
    hidden size for hf_causal_lm (ConfigError naming the fix when it cannot be read here)."""
    if model.name != "hf_causal_lm":
        return int(model.d_model)
    d, where = _hf_config(model)
    width = next((d[k] for k in _WIDTH_KEYS if d and isinstance(d.get(k), int)), None)
    if width is None:
        raise ConfigError(
            f"{where}: its hidden size cannot be read here for the packing cost model's "
            "attention width: set batching.attention_width (6 x the model's hidden size)"
        )
    return int(width)
