"""Worker side, no Ray: re-chunk a rank's ordered rows into its plan's micro-batches and pad them.

(Packed plans: a micro-batch is the rank's rows of whole samples, collated by
`pipeline.core.packed_collate`; "rows" below are the stream's samples.)

Blocks arrive in plan order but cut anywhere; each block's sample ids and lengths are checked
against the rank's plan view before use, a micro-batch spanning blocks copies just its own rows
together, and `pipeline.core.collate` pads it (one gather of whole rows per output). An empty
micro-batch (a bucket remainder smaller than the world size) comes out as [0, 0] tensors, so
every rank yields exactly one micro-batch per global step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from pipeline.core.collate import collate
from pipeline.core.packed_collate import collate_packed
from pipeline.core.plan import RankView
from pipeline.data.listcolumn import values_offsets

if TYPE_CHECKING:
    import torch

__all__ = ["MicroBatch", "collate_micro_batch", "deliver", "keep_freed_memory", "TENSOR_KEYS"]

# glibc mallopt parameters (malloc.h) and the values keep_freed_memory sets.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
TRIM_THRESHOLD_BYTES = 256 * 1024 * 1024
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's ceiling for this parameter on 64-bit

TENSOR_KEYS = ("input_ids", "attention_mask", "labels", "position_ids")


@dataclass
class MicroBatch:
    """One rank's micro-batch of one global step; B = 0 (tensors [0, 0]) for an empty one."""

    epoch: int
    step: int
    bucket: int
    sample_ids: np.ndarray
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    num_real_tokens: int
    num_padded_tokens: int
    # The model's inputs already on the training device (`pipeline.train.prefetch` copies them
    # ahead of the step); None: the host tensors above are all there is.
    staged: dict[str, torch.Tensor] | None = field(default=None, repr=False, compare=False)


@dataclass
class _Rows:
    """A block's rows as numpy: ids, token values with absolute offsets, optional supervision."""

    ids: np.ndarray
    values: np.ndarray
    offsets: np.ndarray
    sup_values: np.ndarray | None
    sup_offsets: np.ndarray | None

    @classmethod
    def from_table(cls, t: pa.Table) -> _Rows:
        values, offsets = values_offsets(t["input_ids"])
        sv = so = None
        if "sup" in t.column_names:
            sv, so = values_offsets(t["sup"])
        return cls(t["sample_id"].to_numpy(), values, offsets, sv, so)

    @property
    def n(self) -> int:
        return int(self.ids.size)

    def take(self, i: int, j: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """(ids, contiguous values, lengths, contiguous supervision) of rows [i, j), zero-copy."""
        off = self.offsets
        sup = None
        if self.sup_values is not None:
            sup = self.sup_values[self.sup_offsets[i] : self.sup_offsets[j]]
        return self.ids[i:j], self.values[off[i] : off[j]], np.diff(off[i : j + 1]), sup


class _PlanCursor:
    """Walks a rank's blocks in plan order: which block holds plan row `pos`, ids checked."""

    def __init__(self, view: RankView, blocks: Iterable[pa.Table], epoch: int):
        self.view, self.epoch = view, epoch
        self.total = int(view.offsets[-1])
        self.it = iter(blocks)
        self.cur: _Rows | None = None
        self.start, self.n = 0, 0  # plan row of the current block's first row; its row count

    def rows(self, a: int, b: int) -> list[tuple]:
        """The pieces (see `_Rows.take`) holding plan rows [a, b), loading blocks as needed."""
        pieces, pos = [], a
        while pos < b:
            while self.cur is None or pos >= self.start + self.n:
                self._load()
            j = min(b, self.start + self.n)
            pieces.append(self.cur.take(pos - self.start, j - self.start))
            pos = j
        return pieces

    def _load(self) -> None:
        self.start += self.n
        for t in self.it:
            rows = _Rows.from_table(t)
            if rows.n == 0:
                continue
            if self.start + rows.n > self.total:
                raise RuntimeError(
                    f"rank {self.view.rank} epoch {self.epoch}: the stream holds more rows than "
                    f"the plan ({self.total})"
                )
            _check_rows(self.view, rows, self.start, self.epoch)
            self.cur, self.n = rows, rows.n
            return
        raise RuntimeError(
            f"rank {self.view.rank} epoch {self.epoch}: the stream ended after {self.start} of "
            f"{self.total} planned rows"
        )

    def finish(self) -> None:
        for t in self.it:  # nothing may follow the last planned row
            if t.num_rows:
                raise RuntimeError(
                    f"rank {self.view.rank} epoch {self.epoch}: rows left after the last planned step"
                )


@functools.cache
def keep_freed_memory() -> bool:
    """Let this process's C allocator keep freed memory for reuse (glibc only; once per process).

    Padding allocates four [B, L] int64 arrays per micro-batch, a few hundred KB to a few MB,
    and frees them a step later. With glibc's defaults every such free gives the pages back to
    the kernel (heap trimming above 128 KB-32 MB, or one mmap per array), so every micro-batch
    pays a page fault per 4 KB it writes: measured here (a VM, 2 cores) padding ran at ~50 M
    real tok/s with ~155 faults per micro-batch, and at ~300 M without them. Raising the mmap
    threshold to its ceiling and the trim threshold to 256 MB keeps those pages in the heap;
    a process then holds up to that much freed memory. Returns whether glibc accepted it
    (False on other C libraries, where nothing changes).
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    return mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and ok


def _empty_batch(epoch: int, step: int, bucket: int) -> MicroBatch:
    import torch

    z = torch.zeros((0, 0), dtype=torch.int64)
    return MicroBatch(
        epoch, step, bucket, np.zeros(0, np.int64), z, z.clone(), z.clone(), z.clone(), 0, 0
    )


def deliver(
    view: RankView,
    blocks: Iterable[pa.Table],
    *,
    epoch: int,
    pad_id: int = 0,
    pad_to_multiple_of: int = 8,
    supervision: str = "",
    pin_memory: bool = False,
    skip: int = 0,
) -> Iterator[MicroBatch]:
    """Re-chunk a rank's ordered rows (`blocks`) into `view`'s micro-batches and pad them.

    Every block's sample ids and lengths are checked against the plan before use; any
    difference (a changed file, a bug, a scheduling effect) raises instead of training on it.
    `skip` micro-batches are passed over (their rows are still checked, never padded): the
    stream then continues where an interrupted one stopped. The first call in a process sets
    `keep_freed_memory`.
    """
    import torch  # here, not at module level: the feeder and read tasks import this package

    keep_freed_memory()

    offsets = view.offsets
    cursor = _PlanCursor(view, blocks, epoch)
    pin = pin_memory and torch.cuda.is_available()
    for m in range(skip, offsets.size - 1):
        a, b = int(offsets[m]), int(offsets[m + 1])
        step, bucket = int(view.steps[m]), int(view.buckets[m])
        if a == b:
            yield _empty_batch(epoch, step, bucket)
            continue
        pieces = cursor.rows(a, b)
        if len(pieces) == 1:
            ids, vals, lens, sup = pieces[0]
        else:  # a micro-batch spanning blocks: copy just its rows together
            ids, vals, lens = (np.concatenate([p[k] for p in pieces]) for k in range(3))
            sup = None if pieces[0][3] is None else np.concatenate([p[3] for p in pieces])
        out = collate_micro_batch(
            view,
            m,
            vals,
            lens,
            pad_id=pad_id,
            pad_to_multiple_of=pad_to_multiple_of,
            loss_mask=sup if supervision == "loss_mask" else None,
            labels=sup if supervision == "labels" else None,
        )
        t = {k: torch.from_numpy(out[k]) for k in TENSOR_KEYS}
        if pin:
            t = {k: v.pin_memory() for k, v in t.items()}
        B, L = out["input_ids"].shape
        yield MicroBatch(
            epoch=epoch,
            step=step,
            bucket=bucket,
            sample_ids=ids,
            **t,
            num_real_tokens=int(lens.sum()),
            num_padded_tokens=int(B * L),
        )
    cursor.finish()


def collate_micro_batch(
    view: RankView,
    m: int,
    vals: np.ndarray,
    lens: np.ndarray,
    *,
    pad_id: int = 0,
    pad_to_multiple_of: int = 8,
    loss_mask: np.ndarray | None = None,
    labels: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Micro-batch `m` of `view`, whose samples' tokens are `vals` (lengths `lens`), as [B, L]
    arrays: packed plans' rows of whole documents, or padded to the longest (at most its
    bucket's upper edge in the plan's own edges: a baseline's one bucket is [0, top])."""
    doc_offsets = np.concatenate([[0], np.cumsum(lens)])
    if view.row_offsets is not None:  # packed: whole rows of documents
        r0, r1 = int(view.micro_rows[m]), int(view.micro_rows[m + 1])
        return collate_packed(
            vals,
            doc_offsets,
            view.row_offsets[r0 : r1 + 1] - int(view.offsets[m]),
            row_tokens=view.row_tokens,
            pad_id=pad_id,
            loss_mask=loss_mask,
            labels=labels,
        )
    return collate(
        vals,
        doc_offsets,
        upper=view.upper(m),
        pad_to_multiple_of=pad_to_multiple_of,
        pad_id=pad_id,
        loss_mask=loss_mask,
        labels=labels,
    )


def _check_rows(view: RankView, rows: _Rows, lo: int, epoch: int) -> None:
    want = view.sample_ids[lo : lo + rows.n]
    got_len = np.diff(rows.offsets)
    bad = np.flatnonzero((rows.ids != want) | (got_len != view.lengths[lo : lo + rows.n]))
    if bad.size:
        i = int(bad[0])
        m = int(np.searchsorted(view.offsets, lo + i, side="right") - 1)
        raise RuntimeError(
            f"rank {view.rank} epoch {epoch} step {int(view.steps[m])}: delivered sample_id "
            f"{int(rows.ids[i])} (length {int(got_len[i])}) where the plan has sample_id "
            f"{int(want[i])} (length {int(view.lengths[lo + i])}); {bad.size} rows differ in this "
            "block. The data changed since indexing (delete the index cache) or the order broke."
        )
