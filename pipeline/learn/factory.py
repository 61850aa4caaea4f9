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
must then attend within documents only, and says it does with `supports_packed = True`; the
training step may have described the documents on the host and hung them on the mask, which a
model reads with `pipeline.learn.packed_attention.packed_documents(attention_mask)`. It
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

import torch
from torch import nn

from pipeline.core.config import ModelConfig
from pipeline.learn.hf_packed import (
    packed_attention_problem,
    packed_refusal,
    packed_self_check,
    packed_windows,
)
from pipeline.learn.model import MODELS
from pipeline.learn.packed_attention import is_packed, packed_documents

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
    Padded batches run causal SDPA with no mask where the model is configured with SDPA and
    nothing else (padding is on the right, so no real query sees a padded key), else the
    implementation the model is configured with, given the padding mask. Packed
    batches run bucketray's per-document attention (pipeline.learn.hf_attention: the documents
    handed to every attention layer, no mask built, sliding windows applied per document), for
    every configured implementation; a model that attention cannot confine to documents is
    refused (`packed_problem`)."""

    supports_packed = True

    def __init__(self, hf_model: nn.Module, source: str = "model.hf_config"):
        super().__init__()
        from pipeline.learn.hf_attention import causal_usable, register

        register()
        self.hf = hf_model
        self.causal = causal_usable(hf_model.config)  # padded batches: causal SDPA, no mask
        self.source = source  # the setting it was built from, for the lines that name it
        self.windows = packed_windows(hf_model.config)  # sliding windows, per document

    def forward(self, input_ids, attention_mask, position_ids):
        if not is_packed(attention_mask):
            return self._padded(input_ids, attention_mask, position_ids)
        from pipeline.learn.hf_attention import DOCUMENTS_KWARG, per_document_attention

        if torch.is_grad_enabled() and _checkpointing(self.hf):
            raise ValueError(_CHECKPOINTING)
        docs = packed_documents(attention_mask)
        with per_document_attention(self.hf):
            # The document numbers stand in for a 2D padding mask: transformers then looks for
            # no packed sequences in position_ids (a device sync), and the mask function of
            # bucketray's attention builds no mask from them.
            out = self._hf(input_ids, attention_mask, position_ids, **{DOCUMENTS_KWARG: docs})
        return out.logits

    def _padded(self, input_ids, attention_mask, position_ids):
        """A padded batch: with SDPA (the default), causal SDPA without a mask
        (pipeline.learn.hf_attention.CAUSAL_NAME: exact, padding being on the right, with no
        [B, 1, L, L] mask and no host-device synchronisation); any other implementation as
        configured, with the padding mask."""
        from pipeline.learn.hf_attention import CAUSAL_NAME, attention_implementation

        if not self.causal:
            return self._hf(input_ids, attention_mask, position_ids).logits
        with attention_implementation(self.hf, CAUSAL_NAME):
            return self._hf(input_ids, attention_mask, position_ids).logits

    def _hf(self, input_ids, attention_mask, position_ids, **kwargs):
        return self.hf(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            **kwargs,
        )

    def packed_problem(self) -> str | None:
        """Why packed rows would not compute each document alone with this model (its config,
        then one packed forward against each document alone with eager attention, the
        reference every implementation matches); None when they do."""
        from pipeline.learn.hf_attention import attention_implementation

        why = packed_attention_problem(self.hf.config)
        if why is None and _checkpointing(self.hf):
            why = _CHECKPOINTING.removeprefix("batching.mode=packed: ")
        if why is None:
            w = self.windows
            window = w.get("sliding_attention") if isinstance(w, dict) else w
            with attention_implementation(self.hf, "eager"):
                why = packed_self_check(self, self.hf.config.vocab_size, window)
        return None if why is None else packed_refusal(self.source, why)


def _checkpointing(hf: nn.Module) -> bool:
    """Whether any layer of `hf` recomputes its activations in the backward pass."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in hf.modules())


_CHECKPOINTING = (
    "batching.mode=packed: gradient checkpointing recomputes attention in the backward pass "
    "outside bucketray's per-document attention"
)


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
