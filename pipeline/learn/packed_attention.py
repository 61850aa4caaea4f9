"""Per-document causal attention for packed rows, on every device, for built-in and HF models.

A packed row's `attention_mask` holds each token's document number (1, 2, ...; 0 = padding;
pipeline.core.packed_collate), and its `position_ids` restart with every document. A token
attends to the earlier tokens of its own document only, so a packed row computes exactly what
its documents would compute one by one (tested in tests/unit/test_packed_attention.py).

Kernels, chosen per call:
- CUDA, fp16/bf16, no attention dropout: `torch.nn.attention.varlen.varlen_attn` (flash
  attention over the row's documents as variable-length sequences; cu_seqlens from the
  document numbers). Work is the sum of the documents' causal squares, not the row's.
- Otherwise (CPU, fp32, dropout): the documents of the batch are sorted by length and cut into
  groups (`length_groups`), each group padded at the end of every document to its longest and run
  through SDPA with `is_causal=True`, then scattered back. A pad only follows its document's real
  tokens, so causality alone keeps every real query away from it: no [T, T] mask is built, and
  the work is the sum of the documents' causal squares plus the groups' filler instead of the
  row's whole square. Where to cut is exact dynamic programming over the batch's distinct
  lengths under a declared cost (query-key pairs, slots, calls: `COST_PER_SLOT`,
  `COST_PER_CALL`), so the filler stays a few per cent of the work at a few dozen calls. q, k and
  v move into the groups' slots in one gather and the outputs back in another. On CPU without
  dropout the whole path is one autograd node (`_GroupedFlashCPU`: torch's CPU flash kernel and
  its backward per group, each group's gradients copied once into one buffer); elsewhere
  autograd's graph of the same calls runs, with gathers both ways in the backward pass too
  (`_Take`). The only Python loops are over the groups and the distinct lengths. A model
  describes a batch's documents once per forward (`Documents`) and every layer reuses it.
- `block_causal_mask`: the same attention as one SDPA call with a block-diagonal causal boolean
  mask [B, 1, T, T]. It computes (and stores) the row's whole square, so it is the reference the
  grouped path is tested against, and what Hugging Face models get (below).
- Hugging Face models: per-document `position_ids` and the same block-diagonal mask as a 4D mask
  (a 4D mask is used as given), boolean for SDPA, additive for eager attention; a model's
  sliding window is applied within each document (one mask per layer type where its layers
  differ), and attention a mask cannot confine (ALiBi, chunked, recurrent layers) is refused
  (pipeline/learn/hf_packed.py). SDPA ignores a
  restart of `position_ids`, so without the mask every document would attend to the ones before
  it in its row. Flash-attention implementations get no mask and derive the documents from the
  restarting `position_ids`, as Hugging Face's own flattening collator expects.
The padding tail is one more "document" attending to itself: its outputs are finite and its
labels are IGNORE_INDEX, so it never reaches the loss.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "block_causal_mask",
    "cu_seqlens",
    "Documents",
    "document_attention",
    "document_attention_qkv",
    "hf_packed_mask",
    "grouped_document_attention",
    "is_packed",
    "LengthGroups",
    "length_groups",
    "require_packed_support",
    "varlen_usable",
]


def is_packed(attention_mask: torch.Tensor) -> bool:
    """Whether a batch is packed: its mask holds document numbers, as int32
    (`pipeline.core.packed_collate`), where a padded batch's holds 0/1 as int64. The dtype says
    which without reading the values, so a GPU forward never waits on a device sync for it."""
    return attention_mask.dtype == torch.int32


def block_causal_mask(doc: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """[B, 1, T, T] bool: query i may see key j iff j <= i and both are in the same document
    (and, with a sliding `window`, i - j < window, as transformers' sliding-window masks)."""
    T = doc.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=doc.device).tril()
    if window is not None:
        causal = causal & ~torch.ones(T, T, dtype=torch.bool, device=doc.device).tril(-window)
    return ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]


def _document_starts(doc: torch.Tensor) -> torch.Tensor:
    """Where each document of the flattened [B * T] batch starts (padding tails included)."""
    T = doc.shape[-1]
    flat = doc.reshape(-1)
    start = torch.ones_like(flat, dtype=torch.bool)
    start[1:] = flat[1:] != flat[:-1]
    start[::T] = True  # a row never continues the previous row's document
    return torch.nonzero(start).flatten()


def cu_seqlens(doc: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(int32 boundaries of every document of the flattened [B * T] batch, padding tails
    included, and the longest one's length): the varlen kernels' description of the rows."""
    B, T = doc.shape
    idx = _document_starts(doc)
    cu = torch.cat([idx, idx.new_tensor([B * T])]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max())


class LengthGroups(NamedTuple):
    """Where `grouped_document_attention` reads and writes the tokens of a [B, T] batch."""

    gather: torch.Tensor  # [P] int64: token (of the flattened B * T) read into each slot
    shapes: list[tuple[int, int]]  # per group: (documents n, longest L); n * L slots each
    place: torch.Tensor  # [B * T] int64: the slot holding each token's own output
    own: torch.Tensor  # [P] int64: the token whose own slot this is, B * T for a filler slot

    @property
    def sizes(self) -> list[int]:
        """Slots per group (n * L), to split a slot buffer into its groups."""
        return [n * L for n, L in self.shapes]


# The grouped path's cost of one SDPA call over n documents padded to L, forward and backward, in
# units of one causal query-key pair (L * L / 2 of them per document): COST_PER_SLOT per slot,
# COST_PER_CALL per call. Measured on a CPU (fp32, one thread, 4 heads of 32): ~56 ns per pair,
# ~0.6 us per slot, ~40 us per call. Only their ratios matter: they set how many groups a
# batch's documents are split into (`_group_bounds`).
COST_PER_SLOT = 11.0
COST_PER_CALL = 700.0


def _group_bounds(lengths: np.ndarray, counts: np.ndarray) -> list[int]:
    """Split the sorted distinct `lengths` (each held by `counts` documents) into consecutive
    groups, each padded to its longest, at the least total cost (pairs + slots + calls: see the
    constants above). Exact dynamic programming over the u distinct lengths, O(u^2) in numpy.
    Returns the end (exclusive) of every group, in order."""
    u = lengths.size
    cum = np.concatenate([[0], np.cumsum(counts)]).astype(np.float64)
    L = lengths.astype(np.float64)
    best = np.zeros(u + 1)
    start = np.zeros(u + 1, dtype=np.int64)
    for j in range(1, u + 1):
        # groups [i, j) for every i < j: n documents padded to lengths[j - 1]
        n = cum[j] - cum[:j]
        top = L[j - 1]
        cost = best[:j] + n * (top * (top + 1) / 2 + COST_PER_SLOT * top) + COST_PER_CALL
        i = int(np.argmin(cost))
        best[j], start[j] = cost[i], i
    ends, j = [], u
    while j > 0:
        ends.append(j)
        j = int(start[j])
    return ends[::-1]


def length_groups(doc: torch.Tensor) -> LengthGroups:
    """The documents of a [B, T] batch of document numbers (padding tails included, as one more
    document each) grouped by length, laid out as slots: group g is an [n, L] block of slots whose
    row i holds document i's tokens, then filler (copies of later tokens) up to the group's
    longest L.

    Documents are sorted by length and cut into consecutive groups at the least estimated cost
    (`_group_bounds`): a group's filler costs attention work, every group one more kernel call.
    Worked out on the host in numpy (a handful of vectorised steps and a loop over the batch's
    distinct lengths), then moved to `doc`'s device."""
    B, T = doc.shape
    N = B * T
    first = _document_starts(doc).cpu().numpy()
    length = np.diff(first, append=N)
    order = np.argsort(length, kind="stable")
    sorted_first, sorted_length = first[order], length[order]
    lengths, counts = np.unique(sorted_length, return_counts=True)
    last = np.asarray(_group_bounds(lengths, counts)) - 1  # each group's longest distinct length
    # Per group: how many documents (a run of `order`) and the length they are padded to.
    doc_end = np.cumsum(counts)[last]
    n_docs, top = np.diff(doc_end, prepend=0), lengths[last]
    shapes = [(int(n), int(L)) for n, L in zip(n_docs, top, strict=True)]
    padded = np.repeat(top, n_docs)  # per document, in `order`
    slot0 = np.concatenate([[0], np.cumsum(padded)[:-1]])
    P = int(padded.sum())
    # Slot s belongs to document d (in `order`) at step pos = s - slot0[d].
    d = np.repeat(np.arange(order.size), padded)
    pos = np.arange(P) - slot0[d]
    src = sorted_first[d] + pos
    valid = pos < sorted_length[d]
    gather = np.minimum(src, N - 1)
    own = np.where(valid, src, N)
    place = np.empty(N, dtype=np.int64)
    place[src[valid]] = np.flatnonzero(valid)  # every token is in exactly one document

    def to_device(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(doc.device)

    return LengthGroups(to_device(gather), shapes, to_device(place), to_device(own))


class Documents:
    """The documents of a packed [B, T] batch, described once per forward and shared by every
    attention layer: the varlen kernels' boundaries and the grouped path's slots are each worked
    out on first use only (a model with 32 layers would otherwise redo it 32 times)."""

    def __init__(self, doc: torch.Tensor):
        self.doc = doc
        self._cu: tuple[torch.Tensor, int] | None = None
        self._groups: LengthGroups | None = None

    @property
    def cu_seqlens(self) -> tuple[torch.Tensor, int]:
        if self._cu is None:
            self._cu = cu_seqlens(self.doc)
        return self._cu

    @property
    def groups(self) -> LengthGroups:
        if self._groups is None:
            self._groups = length_groups(self.doc)
        return self._groups


def _documents(doc: torch.Tensor | Documents) -> Documents:
    return doc if isinstance(doc, Documents) else Documents(doc)


class _Take(torch.autograd.Function):
    """`x[index]` along dim 0, whose gradient is `g[back]` (`g` with one zero row appended when
    `zero_row`): moving tokens to slots and back with two gathers, where autograd's own
    backward of an index would zero-fill and scatter-add. Exact for the grouped path: a filler
    slot's gradient is zero (its query's output is never read back; its key and value are seen
    only by later filler queries), so dropping it or feeding it zeros loses nothing."""

    @staticmethod
    def forward(ctx, x, index, back, zero_row):
        ctx.save_for_backward(back)
        ctx.zero_row = zero_row
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, g):
        (back,) = ctx.saved_tensors
        if ctx.zero_row:
            g = torch.cat([g, g.new_zeros((1, *g.shape[1:]))])
        return g.index_select(0, back), None, None, None


def _fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q, k, v [B, H, T, D] as one qkv [B, T, 3, H, D], the layout of a fused projection."""
    return torch.stack([x.transpose(1, 2) for x in (q, k, v)], dim=2)


_FLASH_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_FLASH_CPU_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _heads_first(part: torch.Tensor, n: int, L: int) -> tuple[torch.Tensor, ...]:
    """A group's slots [n * L, 3, H, D] as q, k, v [n, H, L, D] views (no copy)."""
    _, _, H, D = part.shape
    return part.view(n, L, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)


class _GroupedFlashCPU(torch.autograd.Function):
    """The grouped path on CPU as one autograd node: torch's CPU flash-attention kernel and its
    backward called per group, on views of one slot buffer. Autograd's own graph of the same
    path stacks q, k, v's gradients, concatenates the groups' and zero-fills the filler; here
    each group's gradients are copied once into one buffer and gathered back to the tokens."""

    @staticmethod
    def forward(ctx, qkv, groups):
        _, _, H, D = qkv.shape
        slots = qkv.index_select(0, groups.gather)
        outs, lses = [], []
        for part, (n, L) in zip(slots.split(groups.sizes), groups.shapes, strict=True):
            out, lse = _FLASH_CPU(*_heads_first(part, n, L), 0.0, True)
            outs.append(out)
            lses.append(lse)
        # The kernel's output [n, H, L, D] is a transposed view of a contiguous [n, L, H, D].
        out_slots = torch.cat([o.transpose(1, 2).reshape(-1, H, D) for o in outs])
        ctx.save_for_backward(slots, out_slots, *lses)
        ctx.groups = groups
        return out_slots.index_select(0, groups.place)

    @staticmethod
    def backward(ctx, grad):
        slots, out_slots, *lses = ctx.saved_tensors
        groups = ctx.groups
        _, _, H, D = slots.shape
        # A filler slot's output is never read back: its gradient is zero.
        g = torch.cat([grad.contiguous(), grad.new_zeros((1, H, D))]).index_select(0, groups.own)
        dslots = torch.empty_like(slots)
        sizes = groups.sizes
        parts = zip(
            slots.split(sizes),
            out_slots.split(sizes),
            g.split(sizes),
            dslots.split(sizes),
            lses,
            strict=True,
        )
        for (part, out, gp, dp, lse), (n, L) in zip(parts, groups.shapes, strict=True):
            q, k, v = _heads_first(part, n, L)
            heads = [x.view(n, L, H, D).transpose(1, 2) for x in (out, gp)]
            dq, dk, dv = _FLASH_CPU_BACKWARD(heads[1], q, k, v, heads[0], lse, 0.0, True)
            for dst, src in zip(_heads_first(dp, n, L), (dq, dk, dv), strict=True):
                dst.copy_(src)
        # A filler slot's gradient is zero too (module docstring), so gathering each token's own
        # slot is the whole gradient.
        return dslots.index_select(0, groups.place), None


def _flash_cpu_usable(qkv: torch.Tensor, dropout_p: float) -> bool:
    """`_GroupedFlashCPU` runs: a CPU tensor and no attention dropout (the backward would have to
    replay the forward's dropout); elsewhere autograd's graph of the same calls runs."""
    return qkv.device.type == "cpu" and dropout_p == 0.0


def _grouped_qkv(qkv: torch.Tensor, docs: Documents, dropout_p: float) -> torch.Tensor:
    """The grouped path on qkv [B, T, 3, H, D]; returns [B, T, H, D]."""
    B, T, _, H, D = qkv.shape
    groups = docs.groups
    if _flash_cpu_usable(qkv, dropout_p):
        return _GroupedFlashCPU.apply(qkv.reshape(B * T, 3, H, D), groups).view(B, T, H, D)
    slots = _Take.apply(qkv.reshape(B * T, 3, H, D), groups.gather, groups.place, False)
    outs = []
    for part, (n, L) in zip(slots.split(groups.sizes), groups.shapes, strict=True):
        # [n * L, 3, H, D] -> 3 x [n, H, L, D]. The filler after each document is never attended
        # to by its real queries (causal), and the filler's own outputs are never read back.
        q, k, v = _heads_first(part, n, L)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
        outs.append(out.transpose(1, 2).reshape(n * L, H, D))
    out = _Take.apply(torch.cat(outs), groups.place, groups.own, True)
    return out.view(B, T, H, D)


def grouped_document_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    doc: torch.Tensor | Documents,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Causal attention within documents without a [T, T] mask (module docstring): one causal
    SDPA call per length group. q, k, v: [B, H, T, D]; doc: [B, T]. Returns [B, H, T, D].

    One gather into the slots for q, k and v together and one back for all groups, in the
    backward pass too: one autograd node on CPU (`_GroupedFlashCPU`), `_Take` elsewhere."""
    return _grouped_qkv(_fused(q, k, v), _documents(doc), dropout_p).transpose(1, 2)


def varlen_usable(q: torch.Tensor, dropout_p: float) -> bool:
    """varlen_attn runs flash attention: CUDA, half precision, no attention dropout."""
    return q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and dropout_p == 0.0


def document_attention_qkv(
    qkv: torch.Tensor, doc: torch.Tensor | Documents, dropout_p: float = 0.0
) -> torch.Tensor:
    """Causal attention within documents, from the fused projection: qkv [B, T, 3, H, D] (as a
    model's one qkv linear lays it out), doc: [B, T] document numbers or their `Documents`.
    Returns [B, T, H, D], ready for the output projection."""
    docs = _documents(doc)
    if varlen_usable(qkv, dropout_p):
        from torch.nn.attention.varlen import varlen_attn

        B, T, _, H, D = qkv.shape
        cu, longest = docs.cu_seqlens
        q, k, v = qkv.reshape(B * T, 3, H, D).unbind(1)
        out = varlen_attn(q, k, v, cu, cu, longest, longest, window_size=(-1, 0))
        return out.view(B, T, H, D)
    return _grouped_qkv(qkv, docs, dropout_p)


def document_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    doc: torch.Tensor | Documents,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Causal attention within documents. q, k, v: [B, H, T, D]; doc: [B, T] document numbers
    or their `Documents`. Returns [B, H, T, D]."""
    return document_attention_qkv(_fused(q, k, v), doc, dropout_p).transpose(1, 2)


def hf_packed_mask(
    doc: torch.Tensor,
    attn_implementation: str | None,
    dtype: torch.dtype,
    windows: int | dict[str, int | None] | None = None,
):
    """The 4D mask to hand a Hugging Face model for a packed batch (module docstring), or None
    for flash-attention implementations, which take the documents from `position_ids`.
    `windows` (pipeline.learn.hf_packed.packed_windows): a sliding window every layer applies,
    per document; or, for a model whose layers differ, one mask per layer type (the mapping
    such models take in place of one mask)."""
    if attn_implementation and "flash" in attn_implementation:
        return None
    if isinstance(windows, dict):
        masks = {w: block_causal_mask(doc, w) for w in set(windows.values())}
        return {t: _as_hf_mask(masks[w], attn_implementation, dtype) for t, w in windows.items()}
    return _as_hf_mask(block_causal_mask(doc, windows), attn_implementation, dtype)


def _as_hf_mask(allowed: torch.Tensor, attn_implementation: str | None, dtype: torch.dtype):
    """Boolean for SDPA and flex attention, additive (0 / dtype's min) for eager attention."""
    if attn_implementation in (None, "sdpa", "flex_attention"):
        return allowed
    neg = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return neg.masked_fill_(~allowed, torch.finfo(dtype).min)


def require_packed_support(model) -> None:
    """Refuse a model that would read a packed batch's document numbers as a padding mask, or
    whose attention a per-document mask cannot confine (its `packed_problem()`, e.g. a Hugging
    Face model with ALiBi or recurrent layers: pipeline.learn.hf_packed)."""
    if not getattr(model, "supports_packed", False):
        raise ValueError(
            f"batching.mode=packed needs a model that attends within documents; "
            f"{type(model).__name__} does not declare supports_packed = True: use tiny_decoder or "
            "hf_causal_lm, or make your model honour document numbers in attention_mask "
            "(pipeline/learn/packed_attention.py) and set supports_packed = True"
        )
    problem = getattr(model, "packed_problem", None)
    why = problem() if callable(problem) else None
    if why:
        raise ValueError(why)
