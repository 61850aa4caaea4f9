"""Where the grouped path of pipeline.learn.packed_attention reads and writes a packed batch's
tokens: its documents sorted by length and cut into groups, each an [n, L] block of slots, at
the least estimated cost. Pure numpy on the host, from where each document starts; the index
tensors are then copied to the device (pinned, without waiting, for CUDA)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

__all__ = ["COST_PER_CALL", "COST_PER_SLOT", "LengthGroups", "groups_from_starts", "to_device"]


def to_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on `device` without waiting: pinned first for CUDA, where a copy out of
    pageable memory would wait for the stream."""
    t = torch.from_numpy(a)
    if device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


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


def groups_from_starts(first: np.ndarray, N: int, device: torch.device) -> LengthGroups:
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

    gather, place, own = (to_device(a, device) for a in (gather, place, own))
    return LengthGroups(gather, shapes, place, own)
