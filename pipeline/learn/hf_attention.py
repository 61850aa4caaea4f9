"""Per-document attention for Hugging Face models on packed rows, without a [T, T] mask.

transformers looks up a model's attention function, and the function that builds its mask, by
name (`config._attn_implementation`) in two registries, `AttentionInterface` and
`AttentionMaskInterface`. This module registers one name, `bucketray_documents`: its mask
function builds no mask, and its attention function runs pipeline.learn.packed_attention's
`document_attention` (flash varlen on CUDA in half precision, the grouped SDPA path elsewhere)
on the documents it is handed. Models built on transformers' attention interface (Llama, Qwen2,
Mistral, Gemma, ...) pass the keyword arguments of their forward down to that function, so
`HFCausalLM` hands the documents over as one keyword argument (`DOCUMENTS_KWARG`).

`per_document_attention(model)` switches a model to that name for one packed forward and back
afterwards, so padded batches keep the attention implementation the user configured (sdpa,
eager, flash_attention_2/3, flex_attention) exactly as it is. Because the switch lasts one
forward, a backward pass that recomputes attention (gradient checkpointing) would run the user's
implementation on packed rows: `HFCausalLM` refuses packed rows with it.

The attention function applies what it is given: `scaling`, `dropout`, grouped-query heads
(fewer key/value heads) and `sliding_window` (within each document). What it cannot compute
exactly it refuses in one line (`PackedAttentionError`): no documents (a model whose forward
does not pass keyword arguments down to attention), a mask the model built itself, soft-capped
scores (`softcap`), attention sinks (`s_aux`), position biases, non-causal attention, value
heads of another size than the query's. The packed self-check (pipeline.learn.hf_packed) runs
one forward through it before training, so such a model is refused, never trained on rows whose
documents see each other.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from pipeline.learn.packed_attention import Documents, document_attention

__all__ = [
    "ATTENTION_NAME",
    "CAUSAL_NAME",
    "DOCUMENTS_KWARG",
    "PackedAttentionError",
    "attention_implementation",
    "causal_usable",
    "per_document_attention",
    "register",
]

ATTENTION_NAME = "bucketray_documents"
DOCUMENTS_KWARG = "bucketray_documents"
# Padded batches of a model configured with plain SDPA (the default): causal SDPA with no mask.
# Padding is on the right, so causality alone keeps real queries away from padded keys. Handing
# transformers the 2D padding mask (rather than none) keeps it from searching position_ids for
# packed sequences, and this name's mask function then builds nothing from it: no [B, 1, L, L]
# mask, SDPA's flash kernel, and no host-device synchronisation in the forward.
CAUSAL_NAME = "bucketray_causal"


class PackedAttentionError(ValueError):
    """A packed forward asked the attention function for something it cannot compute exactly."""


def _problem(module, query, key, value, attention_mask, kwargs) -> str | None:
    """Why this call cannot be computed per document exactly; None when it can."""
    if not isinstance(kwargs.get(DOCUMENTS_KWARG), Documents):
        return (
            f"{type(module).__name__} is not handed the documents: the model's forward does not "
            "pass its keyword arguments down to attention"
        )
    if attention_mask is not None:
        return f"{type(module).__name__} builds an attention mask of its own"
    checks = {
        "softcap": "soft-capped attention scores (softcap)",
        "s_aux": "attention sinks (s_aux)",
        "position_bias": "attention position biases",
    }
    for name, what in checks.items():
        if kwargs.get(name) is not None:
            return f"its attention uses {what}, which the per-document kernels do not compute"
    if kwargs.get("is_causal") is False or getattr(module, "is_causal", True) is False:
        return "its attention is not causal"
    if query.shape[-1] != value.shape[-1] or query.shape[2] != key.shape[2]:
        return "its attention has keys or values of another length or size than its queries"
    return None


def _attention(
    module: nn.Module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs,
):
    """transformers' attention-function signature: query [B, H, T, D], key and value
    [B, Hkv, T, D]; returns ([B, T, H, D], no weights)."""
    why = _problem(module, query, key, value, attention_mask, kwargs)
    if why:
        raise PackedAttentionError(why)
    device = query.device.type
    if torch.is_autocast_enabled(device):
        # As SDPA under autocast: rotary embeddings leave q and k in fp32 (cos and sin follow
        # the fp32 hidden states), which would keep the flash kernel from running.
        dtype = torch.get_autocast_dtype(device)
        query, key, value = (x.to(dtype) for x in (query, key, value))
    out = document_attention(
        query,
        key,
        value,
        kwargs[DOCUMENTS_KWARG],
        dropout_p=float(dropout),
        scale=scaling,
        window=sliding_window,
    )
    return out.transpose(1, 2).contiguous(), None


def _causal(
    module: nn.Module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs,
):
    """Causal SDPA for a right-padded batch (`CAUSAL_NAME`); returns ([B, T, H, D], no weights).
    `HFCausalLM` uses it only for models whose SDPA attention is exactly this: no sliding window,
    no soft-capping, no sinks (`causal_usable`); anything else is an error of ours."""
    if sliding_window is not None or any(kwargs.get(k) is not None for k in ("softcap", "s_aux")):
        raise PackedAttentionError(
            f"{type(module).__name__}: bucketray's causal attention got a window, soft-capping "
            "or sinks; such models keep their own attention (HFCausalLM.causal_usable)"
        )
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        dropout_p=float(dropout) if module.training else 0.0,
        is_causal=True,
        scale=scaling,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


def causal_usable(config) -> bool:
    """Whether a model's padded batches may run `CAUSAL_NAME`: configured with SDPA, every layer
    full causal attention with no window, no soft-capping, no attention sinks."""
    impl = getattr(config, "_attn_implementation", None)
    types = set(getattr(config, "layer_types", None) or ["full_attention"])
    return (
        impl == "sdpa"
        and types == {"full_attention"}
        and getattr(config, "sliding_window", None) is None
        and not getattr(config, "attn_logit_softcapping", None)
        and getattr(config, "model_type", "") != "gpt_oss"
    )


def _no_mask(*args, **kwargs) -> None:
    """The mask function of `ATTENTION_NAME`: the documents replace the mask."""
    return None


def register() -> None:
    """Register `ATTENTION_NAME` with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, _attention)
    AttentionMaskInterface.register(ATTENTION_NAME, _no_mask)
    AttentionInterface.register(CAUSAL_NAME, _causal)
    AttentionMaskInterface.register(CAUSAL_NAME, _no_mask)


@contextmanager
def attention_implementation(model: nn.Module, name: str) -> Iterator[None]:
    """Run `model` (a transformers model) with attention implementation `name`, then put back
    what its config and sub-configs had."""
    conf = model.config
    before = {"": conf._attn_implementation}
    for key in getattr(conf, "sub_configs", {}) or {}:
        sub = getattr(conf, key, None)
        if sub is not None:
            before[key] = sub._attn_implementation
    conf._attn_implementation = name
    try:
        yield
    finally:
        conf._attn_implementation = before


def per_document_attention(model: nn.Module):
    """`model` attends through `ATTENTION_NAME` for the duration (module docstring)."""
    return attention_implementation(model, ATTENTION_NAME)
