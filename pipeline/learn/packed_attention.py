"""Per-document causal attention for packed rows, on every device, for built-in and HF models.

A packed row's `attention_mask` holds each token's document number (1, 2, ...; 0 = padding;
pipeline.core.packed_collate), and its `position_ids` restart with every document. A token
attends to the earlier tokens of its own document only, so a packed row computes exactly what
its documents would compute one by one (tests/unit/test_packed_attention.py).

A model describes a batch's documents once per forward (`Documents`; every layer reuses it).
Finding where documents start reads the document numbers on the host: the training step does
it from the collated CPU copy before the forward, `attach_documents(device_mask, cpu_mask)`,
which hangs the `Documents` on the device mask as its `.documents` attribute; a model's forward
takes them with `packed_documents(attention_mask)` (the model's call signature is unchanged) and
then reads nothing back from the device. Without them (tests, your own loop) `packed_documents`
describes the mask itself, at the price of one device-to-host copy per forward.

Kernels, chosen per call (`document_attention`: q [B, H, T, D], k and v with H or fewer heads,
an optional `scale` and sliding `window` of keys within the document):
- CUDA, fp16/bf16, no attention dropout: `torch.nn.attention.varlen.varlen_attn` (flash
  attention over the row's documents as variable-length sequences). Work is the sum of the
  documents' causal squares, not the row's.
- Otherwise (CPU, fp32, dropout): the documents of the batch are sorted by length and cut into
  groups (`length_groups`), each group padded at the end of every document to its longest and run
  through SDPA with `is_causal=True` (a window: an [L, L] band per group), then scattered back.
  A pad only follows its document's real tokens, so causality alone keeps every real query away
  from it: no [T, T] mask is built. Where to cut is exact dynamic programming over the batch's
  distinct lengths under a declared cost (query-key pairs, slots, calls: `COST_PER_SLOT`,
  `COST_PER_CALL`). q, k and v move into the groups' slots in one gather and the outputs back in
  another. On CPU without dropout the whole path is one autograd node (`_GroupedFlashCPU`:
  torch's CPU flash kernel and its backward per group); elsewhere autograd's graph of the same
  calls runs, with gathers both ways in the backward pass too (`_Take`).
- `block_causal_mask`: the same attention as one SDPA call with a block-diagonal causal boolean
  mask [B, 1, T, T]; the reference the other paths are tested against, never used to train.
Hugging Face models reach these kernels through an attention function registered with
transformers (pipeline/learn/hf_attention.py), whatever attention implementation they are
configured with. The padding tail is one more "document" attending to itself: its outputs are
finite and its labels are IGNORE_INDEX, so it never reaches the loss.
"""

from __future__ import annotations

import inspect

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.learn.length_groups import LengthGroups, groups_from_starts, to_device

__all__ = [
    "attach_documents",
    "block_causal_mask",
    "cu_seqlens",
    "Documents",
    "document_attention",
    "document_attention_qkv",
    "document_starts",
    "documents_on_host",
    "grouped_document_attention",
    "is_packed",
    "LengthGroups",
    "length_groups",
    "packed_documents",
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


def document_starts(doc: np.ndarray) -> np.ndarray:
    """Where each document of the flattened [B * T] batch starts (padding tails included), from
    a host copy of the [B, T] document numbers."""
    T = doc.shape[-1]
    flat = doc.reshape(-1)
    start = np.ones(flat.size, dtype=bool)
    start[1:] = flat[1:] != flat[:-1]
    start[::T] = True  # a row never continues the previous row's document
    return np.flatnonzero(start)


def _host_starts(doc: torch.Tensor) -> np.ndarray:
    """`document_starts` of a tensor: a device tensor is copied to the host first (one sync)."""
    return document_starts(doc.detach().cpu().numpy())


def _cu_from_starts(starts: np.ndarray, n: int, device: torch.device) -> tuple[torch.Tensor, int]:
    cu = np.append(starts, n).astype(np.int32)
    return to_device(cu, device), int(np.diff(cu).max())


def cu_seqlens(doc: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(int32 boundaries of every document of the flattened [B * T] batch, padding tails
    included, and the longest one's length): the varlen kernels' description of the rows."""
    return _cu_from_starts(_host_starts(doc), doc.numel(), doc.device)


def length_groups(doc: torch.Tensor) -> LengthGroups:
    """The documents of a [B, T] batch of document numbers (padding tails included, as one more
    document each) grouped by length, laid out as slots: group g is an [n, L] block of slots whose
    row i holds document i's tokens, then filler (copies of later tokens) up to the group's
    longest L.

    Documents are sorted by length and cut into consecutive groups at the least estimated cost
    (`_group_bounds`): a group's filler costs attention work, every group one more kernel call.
    Worked out on the host in numpy (a handful of vectorised steps and a loop over the batch's
    distinct lengths), then moved to `doc`'s device."""
    return groups_from_starts(_host_starts(doc), doc.numel(), doc.device)


class Documents:
    """The documents of a packed [B, T] batch, described once per forward and shared by every
    attention layer: the varlen kernels' boundaries and the grouped path's slots are each worked
    out on first use only (a model with 32 layers would otherwise redo it 32 times).

    Built from the device mask (`Documents(doc)`), finding the boundaries copies the document
    numbers to the host once (a sync). Built on the host (`documents_on_host`, what
    `attach_documents` hands the forward), the boundaries are already known: cu_seqlens are on
    their way to the device and the grouped path's slots are computed in numpy when first
    needed, so the forward never waits on the device for them."""

    def __init__(
        self,
        doc: torch.Tensor,
        starts: np.ndarray | None = None,
        device: torch.device | None = None,
    ):
        self.doc = doc
        self.shape = tuple(doc.shape)
        self.device = doc.device if device is None else torch.device(device)
        self._starts = starts  # host-side document starts of the flattened batch, when known
        self._cu: tuple[torch.Tensor, int] | None = None
        self._groups: LengthGroups | None = None

    @property
    def cu_seqlens(self) -> tuple[torch.Tensor, int]:
        if self._cu is None:
            if self._starts is None:
                self._cu = cu_seqlens(self.doc)
            else:
                self._cu = _cu_from_starts(self._starts, self.doc.numel(), self.device)
        return self._cu

    @property
    def groups(self) -> LengthGroups:
        if self._groups is None:
            if self._starts is None:
                self._groups = length_groups(self.doc)
            else:
                self._groups = groups_from_starts(self._starts, self.doc.numel(), self.device)
        return self._groups


def documents_on_host(doc_cpu: torch.Tensor, device) -> Documents:
    """The `Documents` of a packed batch from its CPU document numbers [B, T] (as collated),
    for a forward on `device`: boundaries found in numpy, cu_seqlens copied without waiting."""
    docs = Documents(doc_cpu, document_starts(doc_cpu.numpy()), device)
    docs.cu_seqlens  # noqa: B018 - start the copy now, ahead of the forward
    return docs


def attach_documents(mask: torch.Tensor, mask_cpu: torch.Tensor) -> torch.Tensor:
    """Describe a packed batch's documents on the host and attach them to `mask`, the device
    copy of `mask_cpu` the model will be called with (module docstring); `mask` is returned.
    A padded batch's mask (not int32) is left as it is."""
    if is_packed(mask_cpu) and tuple(mask.shape) == tuple(mask_cpu.shape):
        mask.documents = documents_on_host(mask_cpu, mask.device)
    return mask


def packed_documents(attention_mask: torch.Tensor) -> Documents:
    """The `Documents` of a packed batch's mask: those `attach_documents` described on the
    host, else described from the mask itself (one device sync)."""
    docs = getattr(attention_mask, "documents", None)
    if (
        isinstance(docs, Documents)
        and docs.shape == tuple(attention_mask.shape)
        and docs.device == attention_mask.device
    ):
        return docs
    return Documents(attention_mask)


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


def _band(L: int, window: int | None, dtype: torch.dtype, device) -> torch.Tensor | None:
    """The additive [L, L] mask of causal attention within the last `window` keys (query i sees
    key j iff 0 <= i - j < window, as transformers' sliding windows), or None when causality
    alone is that (no window, or none shorter than the group)."""
    if window is None or L <= window:
        return None
    i = torch.arange(L, device=device)
    gap = i[:, None] - i[None, :]
    return torch.zeros(L, L, dtype=dtype, device=device).masked_fill_(
        (gap < 0) | (gap >= window), float("-inf")
    )


class _GroupedFlashCPU(torch.autograd.Function):
    """The grouped path on CPU as one autograd node: torch's CPU flash-attention kernel and its
    backward called per group, on views of one slot buffer. Autograd's own graph of the same
    path stacks q, k, v's gradients, concatenates the groups' and zero-fills the filler; here
    each group's gradients are copied once into one buffer and gathered back to the tokens."""

    @staticmethod
    def forward(ctx, qkv, groups, scale, window):
        _, _, H, D = qkv.shape
        slots = qkv.index_select(0, groups.gather)
        outs, lses = [], []
        for part, (n, L) in zip(slots.split(groups.sizes), groups.shapes, strict=True):
            band = _band(L, window, qkv.dtype, qkv.device)
            out, lse = _FLASH_CPU(
                *_heads_first(part, n, L), 0.0, band is None, attn_mask=band, scale=scale
            )
            outs.append(out)
            lses.append(lse)
        # The kernel's output [n, H, L, D] is a transposed view of a contiguous [n, L, H, D].
        out_slots = torch.cat([o.transpose(1, 2).reshape(-1, H, D) for o in outs])
        ctx.save_for_backward(slots, out_slots, *lses)
        ctx.groups, ctx.scale, ctx.window = groups, scale, window
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
            band = _band(L, ctx.window, slots.dtype, slots.device)
            dq, dk, dv = _FLASH_CPU_BACKWARD(
                heads[1], q, k, v, heads[0], lse, 0.0, band is None, attn_mask=band, scale=ctx.scale
            )
            for dst, src in zip(_heads_first(dp, n, L), (dq, dk, dv), strict=True):
                dst.copy_(src)
        # A filler slot's gradient is zero too (module docstring), so gathering each token's own
        # slot is the whole gradient.
        return dslots.index_select(0, groups.place), None, None, None


def _flash_cpu_usable(qkv: torch.Tensor, dropout_p: float) -> bool:
    """`_GroupedFlashCPU` runs: a CPU tensor and no attention dropout (the backward would have to
    replay the forward's dropout); elsewhere autograd's graph of the same calls runs."""
    return qkv.device.type == "cpu" and dropout_p == 0.0


def _grouped_qkv(
    qkv: torch.Tensor,
    docs: Documents,
    dropout_p: float,
    scale: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """The grouped path on qkv [B, T, 3, H, D]; returns [B, T, H, D]."""
    B, T, _, H, D = qkv.shape
    groups = docs.groups
    if _flash_cpu_usable(qkv, dropout_p):
        flat = qkv.reshape(B * T, 3, H, D)
        return _GroupedFlashCPU.apply(flat, groups, scale, window).view(B, T, H, D)
    slots = _Take.apply(qkv.reshape(B * T, 3, H, D), groups.gather, groups.place, False)
    outs = []
    for part, (n, L) in zip(slots.split(groups.sizes), groups.shapes, strict=True):
        # [n * L, 3, H, D] -> 3 x [n, H, L, D]. The filler after each document is never attended
        # to by its real queries (causal), and the filler's own outputs are never read back.
        q, k, v = _heads_first(part, n, L)
        band = _band(L, window, q.dtype, q.device)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=band, is_causal=band is None, dropout_p=dropout_p, scale=scale
        )
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


def _varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    docs: Documents,
    scale: float | None,
    window: int | None,
) -> torch.Tensor:
    """torch's flash varlen_attn over the documents; q [N, H, D], k and v [N, Hkv, D] (the
    flattened B * T tokens). A sliding window of W keys is flash's left window W - 1."""
    from torch.nn.attention.varlen import varlen_attn

    cu, longest = docs.cu_seqlens
    kw = {}
    if k.shape[1] != q.shape[1]:  # grouped-query heads
        if "enable_gqa" in inspect.signature(varlen_attn).parameters:
            kw["enable_gqa"] = True
        else:
            k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], 1) for x in (k, v))
    if scale is not None:
        kw["scale"] = scale
    left = -1 if window is None else window - 1
    return varlen_attn(q, k, v, cu, cu, longest, longest, window_size=(left, 0), **kw)


def document_attention_qkv(
    qkv: torch.Tensor,
    doc: torch.Tensor | Documents,
    dropout_p: float = 0.0,
    scale: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Causal attention within documents, from the fused projection: qkv [B, T, 3, H, D] (as a
    model's one qkv linear lays it out), doc: [B, T] document numbers or their `Documents`;
    `scale` (default 1 / sqrt(D)), a sliding `window` of keys per query within its document.
    Returns [B, T, H, D], ready for the output projection."""
    docs = _documents(doc)
    if varlen_usable(qkv, dropout_p):
        B, T, _, H, D = qkv.shape
        q, k, v = qkv.reshape(B * T, 3, H, D).unbind(1)
        return _varlen(q, k, v, docs, scale, window).view(B, T, H, D)
    return _grouped_qkv(qkv, docs, dropout_p, scale, window)


def document_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    doc: torch.Tensor | Documents,
    dropout_p: float = 0.0,
    scale: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Causal attention within documents. q: [B, H, T, D]; k, v: [B, Hkv, T, D] (Hkv divides
    H: grouped-query heads); doc: [B, T] document numbers or their `Documents`; `scale` and
    `window` as `document_attention_qkv`. Returns [B, H, T, D]."""
    B, H, T, D = q.shape
    docs = _documents(doc)
    if varlen_usable(q, dropout_p):
        flat = (x.transpose(1, 2).reshape(B * T, x.shape[1], D) for x in (q, k, v))
        return _varlen(*flat, docs, scale, window).view(B, T, H, D).transpose(1, 2)
    if k.shape[1] != H:  # the grouped path runs every query head on its own key/value head
        k, v = (x.repeat_interleave(H // x.shape[1], 1) for x in (k, v))
    return _grouped_qkv(_fused(q, k, v), docs, dropout_p, scale, window).transpose(1, 2)


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
