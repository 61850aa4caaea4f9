"""Which model to train: the built-in registry, a Hugging Face causal LM, or your own factory.

`model.name` picks one of three kinds:

- a registry entry (`pipeline.learn.model.MODELS`, e.g. `tiny_decoder`);
- `hf_causal_lm`: a `transformers` causal LM built with `AutoModelForCausalLM.from_config` from
  `model.hf_config` -- a local `config.json` (or a directory holding one) or an inline dict with
  a `model_type` (e.g. `llama`). Never a hub name: nothing is downloaded. Needs the optional
  extra `bucketray[hf]`. `vocab_size` defaults to `model.vocab_size` and must equal it;
- `package.module:factory`: any importable callable. It is called as `factory(config)` with
  `config = {**model.options, "vocab_size": model.vocab_size, "max_positions": N}` (N: the top
  bucket edge, the longest sequence it will see) and must return an `nn.Module`.

With `model.hf_pretrained` (a `save_pretrained` directory, local or s3://), `hf_causal_lm` starts
from those weights instead (pipeline/learn/pretrained.py: safetensors only, no remote code
unless `model.hf_trust_remote_code`).

THE FORWARD SIGNATURE (the one place it is defined). Every model is called as

    logits = model(input_ids, attention_mask, position_ids)

with three int64 tensors [B, L] as the collate writes them: token ids (padding on the right),
1 for real tokens and 0 for padding, and positions 0..n-1 within each sample (0 on padding).
In packed mode (several samples per row, pipeline.core.packed_collate) the mask holds each
token's document number (1, 2, ...; 0 on padding) and positions restart per document: a model
must then attend within documents only, and says it does with `supports_packed = True`. It
returns float logits [B, L, vocab_size] (or an object with a `.logits` attribute, as Hugging
Face models do; the adapter below unwraps it). The model computes no loss: the training loop
applies bucketray's token-normalised loss (pipeline.learn.loss) to the logits, so the loss of a
step is the mean over every supervised token of the global step, whatever the model.

Checkpoints store `model.state_dict()` and load with `torch.load(weights_only=True)`, so any
model whose state is tensors resumes exactly.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from torch import nn

from pipeline.core.config import ModelConfig
from pipeline.learn.hf_packed import (
    packed_attention_problem,
    packed_refusal,
    packed_self_check,
    packed_windows,
)
from pipeline.learn.model import MODELS
from pipeline.learn.packed_attention import hf_packed_mask, is_packed

__all__ = [
    "HF_CAUSAL_LM",
    "HFCausalLM",
    "build_model",
    "hf_config_dict",
    "load_factory",
    "model_kind",
]

HF_CAUSAL_LM = "hf_causal_lm"


class HFCausalLM(nn.Module):
    """A `transformers` causal LM behind the forward signature above; `.hf` is the HF model.
    Packed batches get per-document positions and a block-diagonal causal mask, with the
    model's sliding windows applied per document (pipeline.learn.packed_attention.hf_packed_mask);
    a model whose attention such a mask cannot confine is refused (`packed_problem`)."""

    supports_packed = True

    def __init__(self, hf_model: nn.Module, source: str = "model.hf_config"):
        super().__init__()
        self.hf = hf_model
        self.source = source  # the setting it was built from, for the lines that name it
        self.windows = packed_windows(hf_model.config)  # sliding windows, per document

    def forward(self, input_ids, attention_mask, position_ids):
        if is_packed(attention_mask):
            impl = getattr(self.hf.config, "_attn_implementation", None)
            attention_mask = hf_packed_mask(attention_mask, impl, self.hf.dtype, self.windows)
        out = self.hf(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        )
        return out.logits

    def packed_problem(self) -> str | None:
        """Why packed rows would not compute each document alone with this model (its config,
        then one packed forward against the documents alone); None when they do."""
        why = packed_attention_problem(self.hf.config)
        impl = getattr(self.hf.config, "_attn_implementation", None) or ""
        if why is None and "flash" not in impl:  # flash: no mask, documents from position_ids
            w = self.windows
            window = w.get("sliding_attention") if isinstance(w, dict) else w
            why = packed_self_check(self, self.hf.config.vocab_size, window)
        return None if why is None else packed_refusal(self.source, why)


def hf_config_dict(spec: str | dict | None) -> dict:
    """`model.hf_config` as a dict: an inline dict, or a local config.json (file or directory)."""
    if spec is None:
        raise ValueError(
            "model.name=hf_causal_lm needs model.hf_config: a local config.json path or an "
            "inline dict with model_type, e.g. {model_type: llama, hidden_size: 64, ...}"
        )
    if isinstance(spec, dict):
        return dict(spec)
    p = Path(spec).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ValueError(
            f"model.hf_config={spec!r}: no such local file; give a config.json path or a "
            "directory holding one (hub names are not downloaded)"
        )
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"model.hf_config: {p} is not valid JSON ({e})") from None


def _build_hf(cfg: ModelConfig, max_positions: int) -> nn.Module:
    if cfg.hf_pretrained is not None:
        from pipeline.learn.pretrained import load_pretrained

        return HFCausalLM(
            load_pretrained(cfg, max_positions), source=f"model.hf_pretrained={cfg.hf_pretrained}"
        )
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        raise ImportError(
            "model.name=hf_causal_lm needs Hugging Face transformers: pip install 'bucketray[hf]'"
        ) from None
    d = hf_config_dict(cfg.hf_config)
    model_type = d.pop("model_type", None)
    if not model_type:
        raise ValueError("model.hf_config needs a model_type (e.g. llama, gpt2, qwen2)")
    d.setdefault("vocab_size", cfg.vocab_size)
    if d["vocab_size"] != cfg.vocab_size:
        raise ValueError(
            f"model.hf_config vocab_size={d['vocab_size']} differs from model.vocab_size="
            f"{cfg.vocab_size}: set both to the tokenizer's vocabulary size"
        )
    hf_cfg = AutoConfig.for_model(model_type, **d)
    limit = getattr(hf_cfg, "max_position_embeddings", None)
    if limit is not None and limit < max_positions:
        raise ValueError(
            f"model.hf_config max_position_embeddings={limit} is below the top bucket edge "
            f"{max_positions}: raise it or lower data.max_length"
        )
    return HFCausalLM(AutoModelForCausalLM.from_config(hf_cfg))


def load_factory(spec: str):
    """The callable named by 'package.module:attr' (one clear error when it cannot be found)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"model.name={spec!r}: expected 'package.module:factory'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(
            f"model.name={spec!r}: cannot import {module_name} ({e}); it must be importable "
            "on every worker (installed, or on PYTHONPATH / the job's working_dir)"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
    if not callable(obj):
        raise ValueError(f"model.name={spec!r}: {module_name} has no callable {attr}")
    return obj


def model_kind(name: str) -> str:
    """What `model.name` names: "registered" (a key of pipeline.learn.model.MODELS), "hf" (a
    Hugging Face causal LM), "factory" ('package.module:factory') or "unknown". The one home of
    this rule, for building a model here and for the driver's check (model_check)."""
    if name in MODELS:
        return "registered"
    if name == HF_CAUSAL_LM:
        return "hf"
    return "factory" if ":" in name else "unknown"


def build_model(cfg: ModelConfig, max_positions: int) -> nn.Module:
    """The model `cfg.name` names, for sequences of up to `max_positions` tokens."""
    kind = model_kind(cfg.name)
    if kind == "registered":
        return MODELS[cfg.name](cfg, max_positions)
    if kind == "hf":
        return _build_hf(cfg, max_positions)
    if kind == "factory":
        config = {**cfg.options, "vocab_size": cfg.vocab_size, "max_positions": max_positions}
        model = load_factory(cfg.name)(config)
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"model.name={cfg.name!r} returned {type(model).__name__}, not a torch nn.Module"
            )
        return model
    raise ValueError(
        f"model.name={cfg.name!r} is not a registered model; choose one of {sorted(MODELS)}, "
        f"{HF_CAUSAL_LM!r} (with model.hf_config), 'package.module:factory', "
        "or add an entry to pipeline.learn.model.MODELS"
    )
