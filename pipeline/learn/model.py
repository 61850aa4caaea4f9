"""Models, chosen by name from a registry; the built-in one is a small decoder-only transformer.

A model is any `nn.Module` with the forward signature pipeline.learn.factory defines
(`logits = model(input_ids, attention_mask, position_ids)`). The train loop knows only that
signature, so another model plugs in by adding a `MODELS` entry; models are built by name in
pipeline.learn.factory (`build_model`), which imports this module, never the reverse.

Attention uses SDPA's causal flag and no explicit mask, which leaves the flash kernel available.
That is exact for real tokens because padding is on the right (collate): every key a real query
position i may see (j <= i) is a real token. Padding rows attend to what precedes them; their
outputs are finite and never reach the loss (their labels are IGNORE_INDEX).

Packed rows (several documents per row, `attention_mask` holding document numbers) attend within
each document instead (pipeline.learn.packed_attention: flash varlen on CUDA; elsewhere causal
SDPA over the documents gathered into length groups, no [T, T] mask); positions restart
per document, so each document computes what it would alone. The documents come from
`packed_documents(attention_mask)`: those the step described on the host and attached to the
mask, else the mask itself (one device sync).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.core.config import ModelConfig
from pipeline.learn.packed_attention import (
    Documents,
    document_attention_qkv,
    is_packed,
    packed_documents,
)

__all__ = ["MODELS", "TinyDecoder", "count_parameters"]


class _Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a GELU MLP."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float):
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, docs: Documents | None = None) -> torch.Tensor:
        B, L, D = x.shape
        qkv = self.qkv(self.ln1(x)).view(B, L, 3, self.n_heads, D // self.n_heads)
        p = self.dropout if self.training else 0.0
        if docs is None:
            q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
            att = att.transpose(1, 2)
        else:
            att = document_attention_qkv(qkv, docs, dropout_p=p)  # [B, L, H, D / H]
        x = x + self.drop(self.proj(att.reshape(B, L, D)))
        return x + self.drop(self.mlp(self.ln2(x)))


class TinyDecoder(nn.Module):
    """Decoder-only transformer with learned positions and tied input/output embeddings."""

    supports_packed = True  # attends within documents (pipeline.learn.packed_attention)

    def __init__(self, cfg: ModelConfig, max_positions: int):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(max_positions, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(
            _Block(cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout) for _ in range(cfg.n_layers)
        )
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok.weight
        self.apply(_init_weights)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        # A padded batch's mask is not needed: padding is on the right, so causal attention
        # already keeps every real query away from padded keys (module docstring). A packed
        # batch's mask numbers the documents each token may attend within, described once for
        # all layers (on the host, when the step attached them: packed_attention).
        docs = packed_documents(attention_mask) if is_packed(attention_mask) else None
        x = self.drop(self.tok(input_ids) + self.pos(position_ids))
        for block in self.blocks:
            x = block(x, docs)
        return self.head(self.ln_f(x))


def _init_weights(m: nn.Module) -> None:
    # GPT-2's initialisation: N(0, 0.02) weights, zero biases.
    if isinstance(m, nn.Linear | nn.Embedding):
        nn.init.normal_(m.weight, std=0.02)
    if isinstance(m, nn.Linear) and m.bias is not None:
        nn.init.zeros_(m.bias)


# name -> builder(model config, longest sequence in positions); pipeline.learn.factory builds them.
MODELS: dict[str, Callable[[ModelConfig, int], nn.Module]] = {
    "tiny_decoder": TinyDecoder,
}


def count_parameters(model: nn.Module) -> int:
    """Distinct trainable parameters (tied weights counted once)."""
    return sum(
        p.numel() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values()
    )
