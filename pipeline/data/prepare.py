"""The preparation of a range: how its rows are read into per-rank blocks, and what that took.

A range [start_step, end_step) of an epoch is the epoch's plan restricted to those steps
(`chapters.chapter_plan`); its rows are keyed rank-major, then step, then slot, and grouped by
the row groups holding them (`read.plan_read_units`). How they are read is decided here, per
range and per row group:

- with delivery.row_cache (default) every range is read in the feeder's process: each row group's
  planned rows come from the row cache (`pipeline.data.rowcache`: the group's checked rows,
  memory-mapped) when it holds them; else from parquet with the same checks
  (`read.read_row_group`), either the whole group, written to the cache first (a chapter's
  preparation fills it), or just the planned rows (a lead-in's range of at most
  `LOCAL_MAX_TOKENS` real tokens: a cold start should wait for a few steps' rows, not a decode
  and write of the corpus). Row groups are read on a few threads (pyarrow decodes without the
  GIL), then each rank's rows are copied in key order into blocks (`pipeline.data.gather`);
- without it, a lead-in's small ranges are read the same way (skipping the Ray Data pass and its
  fixed costs), and every other range by a Ray Data pass that sorts by key across the cluster
  (`pipeline.data.sort_pass`).

`RangePreparer.prepare` returns a `PreparedRange`: the ranks' plan views and block refs, and
`RangeStats`, typed; `RangeStats.as_dict` is the telemetry the feeder publishes.

A Ray Data pass leaves its blocks where its reduce tasks ran; `place_blocks` then copies each
rank's blocks that are not on the rank's node to it (one zero-CPU task per block, pinned to that
node), while the range before trains, so a rank reads its rows from its own node's store.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from pipeline.core.chapters import chapter_plan
from pipeline.core.plan import EpochPlan, RankView
from pipeline.core.ranges import EpochRanges
from pipeline.data.carry import CarryBook
from pipeline.data.gather import UnitSlices, gather_parts
from pipeline.data.index import LengthIndex
from pipeline.data.read import (
    ReadSpec,
    ReadUnits,
    UnitRows,
    background_priority,
    plan_read_units,
    read_row_group,
    read_unit,
)
from pipeline.data.rowcache import RowCache
from pipeline.data.sort_pass import rows_per_block, sorted_parts

__all__ = [
    "LOCAL_MAX_TOKENS",
    "TARGET_BLOCK_BYTES",
    "PreparedRange",
    "RangeKey",
    "RangePreparer",
    "RangeStats",
    "ReadStats",
    "place_blocks",
]

log = logging.getLogger("bucketray.data")

# A part's blocks are sized near this so a worker holds little beyond the micro-batch it pads,
# while per-block overheads (one object fetch, one id check) stay negligible.
TARGET_BLOCK_BYTES = 32 * 1024 * 1024
# A lead-in's ranges of at most this many real tokens read just their rows and never fill the
# row cache; without the row cache they are the only ranges read in the feeder's process.
LOCAL_MAX_TOKENS = 2**24
# Row groups read at once, each decoded on its own thread (pyarrow releases the GIL): one per
# core, at least 2 so a read waiting on storage overlaps a decode, at most 8 (memory: each
# holds a decoded row group).
READ_THREADS = min(8, max(2, os.cpu_count() or 2))


class RangeKey(NamedTuple):
    """Which range: global steps [start_step, end_step) of `epoch` planned for `world_size`."""

    epoch: int
    world_size: int
    start_step: int
    end_step: int


@dataclass(frozen=True)
class ReadStats:
    """How a range's row groups were read: served from the row cache, read whole from parquet
    and cached, or read from parquet; seconds reading them and copying rows into blocks (a read
    in the feeder's process); transient errors retried by such a read."""

    rg_cached: int = 0
    rg_filled: int = 0
    rg_parquet: int = 0
    read_s: float = 0.0
    gather_s: float = 0.0
    read_retries: int = 0


@dataclass(frozen=True)
class RangeStats:
    """What preparing one range held and took."""

    epoch: int
    world_size: int
    start_step: int
    end_step: int
    epoch_steps: int
    chapter: int  # index of the chapter holding start_step; -1 at the epoch's end
    chapters: int
    bytes: int  # of the ranks' blocks
    steps: int
    rows_sorted: int
    row_groups_read: int
    tokens: int  # real tokens
    in_feeder: bool  # read in the feeder's process, not by a Ray Data pass
    reads: ReadStats
    plan_s: float
    sort_s: float
    split_s: float
    plan_hash: str
    done_at: float  # wall clock, to line preparations up with their consumers
    # Transient read errors retried preparing this range, read tasks' included (counted by
    # the feeder, which they report to).
    read_retries: int = 0
    # A windowed epoch (`pipeline.data.carry`): rows taken from the part held from the window
    # before (not read again), and rows read to be held for the next window.
    rows_held: int = 0
    rows_carried_out: int = 0
    # Blocks copied to their rank's node after the pass (`place_blocks`): bytes, the bytes each
    # node sent for it, and the time it took.
    bytes_placed: int = 0
    placed_from: dict = dataclasses.field(default_factory=dict)
    place_s: float = 0.0

    def as_dict(self) -> dict:
        """The flat telemetry record (`Feeder.history`, `Feeder.status`, benchmarks)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        reads = dataclasses.asdict(d.pop("reads"))
        del reads["read_retries"]
        tail = {k: d.pop(k) for k in ("plan_s", "sort_s", "split_s", "plan_hash", "done_at")}
        last = {
            k: d.pop(k)
            for k in (
                "read_retries",
                "rows_held",
                "rows_carried_out",
                "bytes_placed",
                "placed_from",
                "place_s",
            )
        }
        return d | reads | tail | last


@dataclass(frozen=True, eq=False)
class PreparedRange:
    """A prepared range: per rank its plan view and ordered block refs."""

    prep_id: str  # tells a re-preparation of the same key from the one a worker saw fail
    plan_hash: str  # content hash of the whole epoch's plan
    views: list[RankView]
    refs: list[list]  # per rank: ordered block refs of its part
    parts: list  # MaterializedDatasets or LocalParts, kept so their blocks stay alive
    stats: RangeStats


class RangePreparer:
    """Prepares ranges of one run's epochs (see the module docstring)."""

    def __init__(
        self,
        fs: pafs.FileSystem,
        spec: ReadSpec,
        index: LengthIndex,
        rows: RowCache | None,
        block_bytes: int = TARGET_BLOCK_BYTES,
        windows_of: Callable[[int], np.ndarray] | None = None,
    ):
        """`windows_of(epoch)`: each index position's window in `epoch`, for windowed epochs
        (`pipeline.core.epochs.epoch_windows`)."""
        self.fs, self.spec, self.index, self.rows = fs, spec, index, rows
        self.block_bytes = int(block_bytes)
        one = lambda epoch: np.zeros(index.num_samples, dtype=np.int64)  # noqa: E731
        self.carry = CarryBook(windows_of or one, index.sample_ids)

    def prepare(
        self,
        epoch_ranges: EpochRanges,
        key: RangeKey,
        *,
        started: float,
        note_retries: Callable[[tuple, int], None],
        nodes: list[str | None] | None = None,
    ) -> PreparedRange:
        """Prepare range `key` of its epoch (`epoch_ranges`: its full plan and chapter bounds).
        `started`: when the preparation began (perf_counter; plan_s counts from there);
        `note_retries(key, n)` is told the transient errors a read in this process retried (a
        Ray Data pass's tasks report theirs to the calling feeder actor themselves). `nodes`:
        each rank's node, where known; where every rank's is, a pass's blocks are placed there
        (`place_blocks`)."""
        full = epoch_ranges.plan
        plan_hash = full.content_hash
        plan = chapter_plan(full, key.start_step, key.end_step)
        keys, rank_rows = plan.sort_keys()
        units = plan_read_units(self.index, plan.sample_ids, keys)
        t_plan = time.perf_counter()
        parts: list = []
        refs: list[list] = [[] for _ in range(key.world_size)]
        local, fill = self._how(plan, epoch_ranges.is_lead_in(key.start_step, key.end_step))
        block_rows = rows_per_block(plan, self.block_bytes) if plan.num_samples else 1
        reads = ReadStats()
        held_rows = carried_out = 0
        if local:
            parts, reads = self._read_locally(units, rank_rows, block_rows, fill)
            if reads.read_retries:
                note_retries(key, reads.read_retries)
        elif plan.num_samples:
            carry = self.carry.plan_range(full, key.start_step, key.end_step)
            if carry is None:
                parts = sorted_parts(self.fs, self.spec, plan, units, rank_rows, block_rows, key)
            else:
                parts, units = self._windowed_parts(plan, keys, rank_rows, block_rows, key, carry)
                held_rows, carried_out = carry.num_held, int(carry.out_sids.size)
            reads = ReadStats(rg_parquet=len(units))
        t_sort = time.perf_counter()
        if parts:
            refs = [p.to_arrow_refs() for p in parts]
        t_split = time.perf_counter()
        size, placed = int(sum(p.size_bytes() for p in parts)), {}
        if parts and not local and nodes and all(nodes):  # every rank has said where it is
            refs, placed = place_blocks(refs, list(nodes))
            if placed:  # the pass's own copies of the moved blocks are no longer needed
                parts = []
        stats = RangeStats(
            epoch=key.epoch,
            world_size=key.world_size,
            start_step=key.start_step,
            end_step=key.end_step,
            epoch_steps=epoch_ranges.num_steps,
            chapter=epoch_ranges.chapter_of(key.start_step),
            chapters=epoch_ranges.num_chapters,
            bytes=size,
            steps=plan.num_steps,
            rows_sorted=plan.num_samples,
            row_groups_read=len(units),
            tokens=int(plan.lengths.sum()),
            in_feeder=local,
            reads=reads,
            plan_s=t_plan - started,
            sort_s=t_sort - t_plan,
            split_s=t_split - t_sort,
            plan_hash=plan_hash,
            done_at=time.time(),
            rows_held=held_rows,
            rows_carried_out=carried_out,
            bytes_placed=sum(placed.values()),
            placed_from=placed,
            place_s=time.perf_counter() - t_split if placed else 0.0,
        )
        return PreparedRange(
            prep_id=uuid.uuid4().hex[:12],
            plan_hash=plan_hash,
            views=[plan.rank_view(r) for r in range(key.world_size)],
            refs=refs,
            parts=parts,
            stats=stats,
        )

    def _windowed_parts(self, plan, keys, rank_rows, block_rows, key, carry) -> tuple:
        """A windowed range's pass: its rows not held read, the held ones taken from the part
        held; the rows it carries out (keyed after its own) read or, where held, taken too; the
        carried part kept for the next window that trains.
        Returns (the ranks' parts, the read work list)."""
        read, n_out = ~carry.held, int(carry.out_sids.size)
        out_keys = plan.num_samples + np.arange(n_out)
        out_held = np.zeros(n_out, dtype=bool) if carry.out_held is None else carry.out_held
        units = plan_read_units(
            self.index,
            np.concatenate([plan.sample_ids[read], carry.out_sids[~out_held]]),
            np.concatenate([keys[read], out_keys[~out_held]]),
        )
        held = None
        if carry.num_held or out_held.any():
            held = (
                carry.part,
                np.concatenate([plan.sample_ids[carry.held], carry.out_sids[out_held]]),
                np.concatenate([keys[carry.held], out_keys[out_held]]),
            )
        try:
            parts = sorted_parts(
                self.fs, self.spec, plan, units, rank_rows, block_rows, key, held, n_out
            )
        except Exception as e:
            if held is None:
                raise
            # The held part is gone (a lost node, say): read those rows from their row groups.
            log.warning(
                "data: the rows held for window %d of epoch %d are lost (%s: %s); reading them "
                "from their row groups",
                carry.window,
                key.epoch,
                type(e).__name__,
                e,
            )
            self.carry.forget(key.epoch, carry.window)
            none, none_out = np.zeros_like(carry.held), np.zeros_like(out_held)
            carry = dataclasses.replace(carry, held=none, part=None, out_held=none_out)
            return self._windowed_parts(plan, keys, rank_rows, block_rows, key, carry)
        if n_out:
            self.carry.keep(key.epoch, carry.into, parts[-1], carry.out_sids, carry.window)
            parts = parts[:-1]
        return parts, units

    def _how(self, plan: EpochPlan, lead_in: bool) -> tuple[bool, bool]:
        """(read in this process, fill the row cache) for a range's `plan`; `lead_in`: the
        range ends before its chapter does."""
        small = lead_in and 0 < int(plan.lengths.sum()) <= LOCAL_MAX_TOKENS
        local = plan.num_samples > 0 and (small or self.rows is not None)
        # A lead-in's small range reads just its rows; a chapter fills the row cache.
        return local, self.rows is not None and not small

    def _read_locally(
        self, units: ReadUnits, rank_rows: np.ndarray, block_rows: int, fill: bool
    ) -> tuple[list, ReadStats]:
        """Read every unit on `READ_THREADS` threads, then gather each rank's blocks."""
        t0 = time.perf_counter()
        n = len(units)
        with ThreadPoolExecutor(
            max(1, min(READ_THREADS, n)), initializer=background_priority
        ) as pool:
            got = list(pool.map(lambda j: self._unit_rows(units.unit(j), fill), range(n)))
        t1 = time.perf_counter()
        spec = self.spec
        sup_dtype = None if spec.sup_type is None else np.dtype(spec.sup_type)
        slices = [u for u, _, _ in got]
        parts = gather_parts(slices, rank_rows, block_rows, np.dtype(spec.id_type), sup_dtype)
        sources = [s for _, _, s in got]
        return parts, ReadStats(
            rg_cached=sources.count("cached"),
            rg_filled=sources.count("filled"),
            rg_parquet=sources.count("parquet"),
            read_s=t1 - t0,
            gather_s=time.perf_counter() - t1,
            read_retries=sum(r for _, r, _ in got),
        )

    def _unit_rows(self, u: UnitRows, fill: bool) -> tuple[UnitSlices, int, str]:
        """A unit's planned rows, from the row cache when it holds them, else read from parquet:
        the whole row group, checked and cached, when `fill`, else just the planned rows.
        Returns (rows, read retries, source: "cached", "filled" or "parquet")."""
        cache, f, g = self.rows, u.file_idx, u.row_group
        if cache is not None:
            c = cache.load(f, g)
            pos = None if c is None else c.positions(u.local_rows)
            if pos is not None:
                rows = UnitSlices.of_cache(c, pos, u.keys)
                if np.array_equal(rows.sids, u.sample_ids) and np.array_equal(
                    rows.ends - rows.starts, u.lengths
                ):
                    return rows, 0, "cached"
            if c is not None:  # rows or lengths the index does not have: read it again
                log.warning(
                    "data: row cache file %s does not match the index; dropped", cache.path(f, g)
                )
                cache.drop(f, g)
            if fill:
                local, all_sids, all_lengths = cache.indexed(f, g)
                zeros = np.zeros(local.size, np.int64)
                t, retries = read_row_group(
                    self.fs, self.spec, f, g, local, zeros, all_sids, all_lengths
                )
                # Served from the file just written (pages the kernel may drop), not from the
                # decoded table: a chapter holds the whole corpus decoded otherwise.
                c = cache.load(f, g) if cache.store(f, g, local, t) else None
                pos = np.searchsorted(local, u.local_rows)
                if c is not None:
                    return UnitSlices.of_cache(c, pos, u.keys), retries, "filled"
                # not cached (no room): keep just the planned rows, not the decoded row group
                return UnitSlices.of_table(t.take(pa.array(pos)), u.keys), retries, "parquet"
        t, retries = read_unit(self.fs, self.spec, u)
        return UnitSlices.of_table(t, u.keys), retries, "parquet"


def _block(block):
    """A placement task's body: the block it is given, returned from the node it runs on."""
    return block


def place_blocks(refs: list[list], nodes: list[str | None]) -> tuple[list[list], dict]:
    """Each rank's block refs, those not already on its node (`nodes[rank]`; None: unknown,
    left where they are; a small block travels inside its ref and stays) copied there by a zero-CPU task pinned to that node (softly: a node
    gone keeps the copy elsewhere), waited for. Returns (the refs, the bytes copied from each
    node that held them)."""
    import ray
    from ray.experimental import get_object_locations
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    flat = [ref for rank_refs in refs for ref in rank_refs]
    if not flat or not any(nodes):
        return refs, {}
    where = get_object_locations(flat)
    copy = ray.remote(num_cpus=0, max_retries=3)(_block)
    out, moved, copied = [], [], {}
    for rank_refs, node in zip(refs, nodes, strict=True):
        if node is None:
            out.append(list(rank_refs))
            continue
        task = copy.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=True))
        mine = []
        for ref in rank_refs:
            loc = where.get(ref) or {}
            held_by = loc.get("node_ids") or ()
            if not held_by or node in held_by:  # on its node, or small: inline in its ref
                mine.append(ref)
            else:
                mine.append(task.remote(ref))
                moved.append(mine[-1])
                src = (loc.get("node_ids") or ["?"])[0]
                copied[src] = copied.get(src, 0) + int(loc.get("object_size") or 0)
        out.append(mine)
    if moved:
        ray.wait(moved, num_returns=len(moved), fetch_local=False)
    return out, copied
