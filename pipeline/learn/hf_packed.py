"""Which Hugging Face models packed rows can train, and the windows their documents keep.

A packed row's documents reach every attention layer through bucketray's attention function
(pipeline/learn/hf_attention.py), which attends causally within each document, applying the
model's sliding window per document: one window for every layer, as Mistral's `sliding_window`,
or one per layer type, as `layer_types` says for Gemma 2, Qwen 2 with `use_sliding_window`, ...
(`packed_windows`, which sizes the self-check's documents). That is wrong for attention the
documents alone do not describe: ALiBi biases (BLOOM, MPT, Falcon with `alibi`) run on the
row's positions, chunked attention (`attention_chunk_size`), GPT-Neo's local layers and every
recurrent or linear layer (Mamba, RWKV, hybrids) carry state from one document into the next,
and soft-capped scores (`attn_logit_softcapping`) or attention sinks (gpt-oss) are not computed
by the per-document kernels. `packed_attention_problem` names those from the config, on the
driver before any worker starts and again in the worker; `packed_self_check` then runs the built
model once on two documents packed in one row and alone, so an architecture this list does not
know (or whose attention is not handed the documents) is refused rather than trained on leaking
rows.
"""

from __future__ import annotations

import torch

from pipeline.learn.hf_attention import PackedAttentionError

__all__ = [
    "PACKED_LAYER_TYPES",
    "packed_attention_problem",
    "packed_refusal",
    "packed_self_check",
    "packed_windows",
]

# Layer types (a config's `layer_types`) whose attention per-document attention computes exactly.
PACKED_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})
# Models whose every layer adds ALiBi biases (no config flag says so).
_ALIBI_MODEL_TYPES = frozenset({"bloom"})
# Models whose attention adds learned sinks (`s_aux`) to every softmax.
_SINK_MODEL_TYPES = frozenset({"gpt_oss"})
# Recurrent models without `layer_types` (those with it say "linear_attention" and the like).
_RECURRENT_MODEL_TYPES = frozenset({"rwkv", "xlstm", "recurrent_gemma", "mamba", "mamba2"})
# Largest logit difference (relative to the largest logit) the self-check accepts between a
# document packed behind another and alone: fp32 rounding is ~1e-6 (6e-8 measured on CPU); a
# document that sees its neighbour differs by 0.15-0.32 in tiny models.
SELF_CHECK_TOLERANCE = 1e-3


def _flag(conf, name: str) -> bool:
    """A config flag, also where it sits in an `attn_config` (MPT's `alibi`)."""
    if getattr(conf, name, None):
        return True
    inner = getattr(conf, "attn_config", None)
    return bool(inner.get(name) if isinstance(inner, dict) else getattr(inner, name, None))


def packed_refusal(key: str, why: str) -> str:
    """The one line refusing packed rows for the model `key` names, `why` from the checks."""
    return (
        f"batching.mode=packed cannot train {key}: {why}, so a document would see the ones "
        "before it in its row; use batching.mode=token_budget (padded batches) for this model"
    )


def packed_attention_problem(conf) -> str | None:
    """Why packed rows would compute something else than each document alone for the model
    this `transformers` config describes; None when per-document attention makes them exact."""
    model_type = getattr(conf, "model_type", "?")
    if model_type in _ALIBI_MODEL_TYPES or _flag(conf, "alibi") or _flag(conf, "use_alibi"):
        return f"model_type={model_type} adds ALiBi position biases, which run over the whole row"
    if getattr(conf, "position_embedding_type", None) == "alibi":
        return "position_embedding_type=alibi adds position biases that run over the whole row"
    types = getattr(conf, "layer_types", None) or ()
    other = sorted({str(t) for t in types} - PACKED_LAYER_TYPES)
    if other:
        return f"layer_types has {other} layers, whose state or chunks cross documents"
    if model_type in _RECURRENT_MODEL_TYPES:
        return f"model_type={model_type} is recurrent: its state carries from one document on"
    if getattr(conf, "attention_chunk_size", None):
        return f"attention_chunk_size={conf.attention_chunk_size} chunks the row, not documents"
    if getattr(conf, "attn_logit_softcapping", None) is not None:
        return (
            f"attn_logit_softcapping={conf.attn_logit_softcapping} soft-caps attention scores, "
            "which the per-document kernels do not"
        )
    if model_type in _SINK_MODEL_TYPES:
        return (
            f"model_type={model_type} adds attention sinks, which the per-document kernels do not"
        )
    local = [t for t in getattr(conf, "attention_layers", None) or () if t == "local"]
    if local:
        return f"attention_layers has {len(local)} 'local' layers (window_size), not supported"
    return None


def packed_windows(conf) -> int | dict[str, int | None] | None:
    """The sliding windows a packed row's documents keep: None (none), one
    window every layer applies (no `layer_types`: transformers then windows every layer when
    `sliding_window` is set), or {layer type: window or None} when the layers differ."""
    window = getattr(conf, "sliding_window", None)
    types = getattr(conf, "layer_types", None)
    if types:
        if "sliding_attention" not in types:
            return None
        return {"full_attention": None, "sliding_attention": window}
    return window


def packed_self_check(model, vocab_size: int, window: int | None) -> str | None:
    """Run `model` (the forward signature of pipeline.learn.factory) on two documents packed in
    one row and on the second alone; the reason to refuse it when their logits differ (or the
    packed forward fails), None when they agree. Documents outrun a small `window`, so a
    window applied to the row rather than per document shows too."""
    first, second = 5, 7 if window is None or window > 60 else window + 3
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_size, (1, first + second), generator=g).to(device)
    doc = torch.tensor([[1] * first + [2] * second], dtype=torch.int32, device=device)
    pos = torch.cat([torch.arange(first), torch.arange(second)])[None].to(device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            packed = model(ids, doc, pos)[0, first:]
            alone_ids = ids[:, first:]
            alone = model(alone_ids, torch.ones_like(alone_ids), pos[:, first:])[0]
    except PackedAttentionError as e:  # what bucketray's attention cannot compute, in one line
        return str(e)
    except Exception as e:  # noqa: BLE001 - any failure of the packed forward refuses the model
        return f"its forward pass fails on a packed row ({type(e).__name__}: {e})"
    finally:
        model.train(was_training)
    err = float((packed.float() - alone.float()).abs().max())
    scale = max(1.0, float(alone.float().abs().max()))
    if err > SELF_CHECK_TOLERANCE * scale:
        return (
            f"a document packed behind another gets other logits than alone (max difference "
            f"{err:.3g}): its attention reaches across documents"
        )
    return None
