"""Per-epoch, per-rank padded batch streams: read, key by the plan, distributed sort, split per rank.

For epoch e the plan gives every sample a key (rank-major, then step, then slot). A Ray Data pass
reads only the row groups holding planned samples, keeps the planned rows, attaches their keys
(`map_batches`), sorts by key across the cluster with range boundaries at the ranks' row offsets
(keys are dense, so no sampling pass is needed), materializes, and `split_at_indices` cuts one
part per rank. A named zero-CPU actor on the driver (the feeder) owns those parts and starts
epoch e+1 as soon as e is ready, so the sort overlaps training. Rank r fetches the blocks of its
part in order, checks every sample id against the plan, re-chunks rows into the plan's
micro-batches and pads each with one boolean-mask scatter; the order is fixed by the keys, not
by Ray's scheduling. Resuming at (e, s) sorts only the plan's tail (`EpochPlan.slice`), so
consumed samples are neither sorted nor delivered, and row groups holding none of the tail are not
read at all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.core.collate import collate
from pipeline.core.config import RunConfig
from pipeline.core.epochs import epoch_plan_for
from pipeline.core.plan import RankView
from pipeline.data.index import DataError, LengthIndex, filesystem_for

if TYPE_CHECKING:
    import torch

__all__ = [
    "MicroBatch",
    "deliver",
    "plan_read_units",
    "start_feeder",
    "stop_feeder",
    "rank_batches",
    "FEEDER_MAX_CONCURRENCY",
]

# A part's blocks are sized near this so a worker holds little beyond the micro-batch it pads,
# while per-block overheads (one object fetch, one id check) stay negligible.
TARGET_BLOCK_BYTES = 32 * 1024 * 1024
# Enough threads for every rank's part() call plus the background preparation.
FEEDER_MAX_CONCURRENCY = 64
SORT_SHUFFLE_STRATEGY = "sort_shuffle_pull_based"
TENSOR_KEYS = ("input_ids", "attention_mask", "labels", "position_ids")
# Handles held by this (driver) process: a named actor without a handle would be reclaimed.
_FEEDERS: dict[str, object] = {}


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


# --------------------------------------------------------------------------- worker side (pure)


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
        def parts(name):
            col = t[name]
            arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
            return arr.values.to_numpy(), arr.offsets.to_numpy().astype(np.int64, copy=False)

        values, offsets = parts("input_ids")
        sv = so = None
        if "sup" in t.column_names:
            sv, so = parts("sup")
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
    edges,
    pad_id: int = 0,
    pad_to_multiple_of: int = 8,
    supervision: str = "",
    pin_memory: bool = False,
) -> Iterator[MicroBatch]:
    """Re-chunk a rank's ordered rows (`blocks`) into `view`'s micro-batches and pad them.

    Every block's sample ids and lengths are checked against the plan before use; any
    difference (a changed file, a bug, a scheduling effect) raises instead of training on it.
    """
    import torch  # here, not at module level: Ray Data read tasks import this module too

    edges = np.asarray(edges, dtype=np.int64)
    offsets = view.offsets
    total = int(offsets[-1])
    it = iter(blocks)
    cur: _Rows | None = None
    cur_start, cur_n = 0, 0  # plan row of the current block's first row; its row count
    pin = pin_memory and torch.cuda.is_available()

    def load() -> None:
        nonlocal cur, cur_start, cur_n
        cur_start += cur_n
        for t in it:
            rows = _Rows.from_table(t)
            if rows.n == 0:
                continue
            lo, hi = cur_start, cur_start + rows.n
            if hi > total:
                raise RuntimeError(
                    f"rank {view.rank} epoch {epoch}: the stream holds more rows than the plan ({total})"
                )
            _check_rows(view, rows, lo, epoch)
            cur, cur_n = rows, rows.n
            return
        raise RuntimeError(
            f"rank {view.rank} epoch {epoch}: the stream ended after {cur_start} of {total} planned rows"
        )

    for m in range(offsets.size - 1):
        a, b = int(offsets[m]), int(offsets[m + 1])
        step, bucket = int(view.steps[m]), int(view.buckets[m])
        if a == b:
            yield _empty_batch(epoch, step, bucket)
            continue
        pieces = []
        pos = a
        while pos < b:
            if cur is None or pos >= cur_start + cur_n:
                load()
            j = min(b, cur_start + cur_n)
            pieces.append(cur.take(pos - cur_start, j - cur_start))
            pos = j
        if len(pieces) == 1:
            ids, vals, lens, sup = pieces[0]
        else:  # a micro-batch spanning blocks: copy just its rows together
            ids, vals, lens = (np.concatenate([p[k] for p in pieces]) for k in range(3))
            sup = None if pieces[0][3] is None else np.concatenate([p[3] for p in pieces])
        out = collate(
            vals,
            np.concatenate([[0], np.cumsum(lens)]),
            upper=int(edges[bucket + 1]),
            pad_to_multiple_of=pad_to_multiple_of,
            pad_id=pad_id,
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
            input_ids=t["input_ids"],
            attention_mask=t["attention_mask"],
            labels=t["labels"],
            position_ids=t["position_ids"],
            num_real_tokens=int(lens.sum()),
            num_padded_tokens=int(B * L),
        )
    for t in it:  # nothing may follow the last planned row
        if t.num_rows:
            raise RuntimeError(
                f"rank {view.rank} epoch {epoch}: rows left after the last planned step"
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


# --------------------------------------------------------------------------- read + key (Ray Data)


def plan_read_units(index: LengthIndex, sample_ids: np.ndarray, keys: np.ndarray) -> dict:
    """Group planned samples by (file, row group): the read work list and its row/key arrays.

    Returns units (file_idx, row_group, row_start) and, ordered by unit then row, the local rows
    to take, their keys, sample ids and indexed lengths, with `ptr` delimiting each unit's slice.
    """
    pos = np.searchsorted(index.sample_ids, sample_ids)
    if sample_ids.size and not np.array_equal(
        index.sample_ids[np.minimum(pos, index.num_samples - 1)], sample_ids
    ):
        raise AssertionError("plan holds sample ids that are not in the index")  # our invariant
    fidx = index.file_idx[pos].astype(np.int64)
    rows = index.rows[pos]
    # Global row-group table: one row per (file, row group) with its first row inside the file.
    rg_file = np.concatenate(
        [np.full(len(r), f, np.int64) for f, r in enumerate(index.row_groups)]
        or [np.zeros(0, np.int64)]
    )
    rg_start = np.concatenate(
        [np.cumsum([0, *r[:-1]]) if r else np.zeros(0, np.int64) for r in index.row_groups]
        or [np.zeros(0, np.int64)]
    ).astype(np.int64)
    rg_num = np.concatenate(
        [np.arange(len(r)) for r in index.row_groups] or [np.zeros(0, np.int64)]
    ).astype(np.int64)
    # Rows of the whole dataset numbered file after file, to find each row's row group at once.
    file_rows = np.array([sum(r) for r in index.row_groups], dtype=np.int64)
    file_base = np.concatenate([[0], np.cumsum(file_rows)[:-1]]).astype(np.int64)
    unit = np.searchsorted(file_base[rg_file] + rg_start, file_base[fidx] + rows, side="right") - 1
    order = np.lexsort((rows, unit))
    unit, rows, keys_o, sids = unit[order], rows[order], keys[order], sample_ids[order]
    lens = index.lengths[pos][order]
    present, first = np.unique(unit, return_index=True)
    ptr = np.concatenate([first, [unit.size]]).astype(np.int64)
    return {
        "file_idx": rg_file[present],
        "row_group": rg_num[present],
        "local_rows": rows - rg_start[unit],
        "keys": keys_o,
        "sample_ids": sids,
        "lengths": lens,
        "ptr": ptr,
    }


def _flat_list(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(values of the rows back to back, lengths), respecting any slice of `arr`."""
    return pc.list_flatten(arr).to_numpy(), pc.list_value_length(arr).to_numpy().astype(np.int64)


def _read_units(
    batch: pa.Table, fs, units_ref, files, has_sid, supervision, truncate_to, id_type
) -> pa.Table:
    import ray

    u = ray.get(units_ref[0])
    out = []
    for j, f, g in zip(
        batch["u"].to_pylist(),
        batch["file_idx"].to_pylist(),
        batch["row_group"].to_pylist(),
        strict=True,
    ):
        path = files[f]
        lo, hi = u["ptr"][j], u["ptr"][j + 1]
        local, keys, sids = u["local_rows"][lo:hi], u["keys"][lo:hi], u["sample_ids"][lo:hi]
        try:
            pf = pq.ParquetFile(fs.open_input_file(path))
            cols = ["input_ids"] + (["sample_id"] if has_sid[f] else [])
            cols += [c for c in ("loss_mask", "labels") if c in pf.schema_arrow.names]
            t = pf.read_row_group(g, columns=cols)
        except (OSError, pa.ArrowException) as e:  # pyarrow's message does not name the file
            raise DataError(
                f"{path}: row group {g} is no longer readable ({type(e).__name__}: {e}): the file "
                "changed since indexing; restore it, or delete the index cache to re-index it "
                "(data.on_bad_rows then decides)"
            ) from e
        if not (local.size == t.num_rows and np.array_equal(local, np.arange(t.num_rows))):
            t = t.take(pa.array(local))  # resume or quarantine: keep only planned rows
        if has_sid[f]:
            got = t["sample_id"].to_numpy()
            if not np.array_equal(got, sids):
                i = int(np.flatnonzero(got != sids)[0])
                raise DataError(
                    f"{path}: row group {g} row {int(local[i])} has sample_id {int(got[i])}, the index "
                    f"says {int(sids[i])}: the file changed since indexing; delete the index cache"
                )
        vals, lens = _flat_list(t["input_ids"].combine_chunks())
        sup = None
        if supervision == "labels":
            sup = (
                _flat_list(t["labels"].combine_chunks())[0] if "labels" in t.column_names else vals
            )
            if "labels" not in t.column_names and "loss_mask" in t.column_names:
                m = _flat_list(t["loss_mask"].combine_chunks())[0]
                sup = np.where(m != 0, vals, -100)
        elif supervision == "loss_mask":
            sup = (
                _flat_list(t["loss_mask"].combine_chunks())[0].astype(np.int8)
                if "loss_mask" in t.column_names
                else np.ones(vals.size, np.int8)
            )
        if truncate_to is not None and lens.size and lens.max() > truncate_to:
            starts = np.cumsum(lens) - lens
            keep = np.minimum(lens, truncate_to)
            idx = np.repeat(starts - (np.cumsum(keep) - keep), keep) + np.arange(int(keep.sum()))
            vals = vals[idx]
            sup = None if sup is None else sup[idx]
            lens = keep
        changed = np.flatnonzero(lens != u["lengths"][lo:hi])
        if changed.size:
            i = int(changed[0])
            raise DataError(
                f"{path}: row group {g} row {int(local[i])} (sample_id {int(sids[i])}) has length "
                f"{int(lens[i])}, the index says {int(u['lengths'][lo + i])}: the file changed "
                "since indexing; delete the index cache"
            )
        offsets = pa.array(np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))
        cols_out = {
            "key": pa.array(keys, pa.int64()),
            "sample_id": pa.array(sids, pa.int64()),
            "input_ids": pa.LargeListArray.from_arrays(
                offsets, pa.array(vals.astype(id_type, copy=False))
            ),
        }
        if sup is not None:
            sup_type = np.int8 if supervision == "loss_mask" else id_type
            cols_out["sup"] = pa.LargeListArray.from_arrays(
                offsets, pa.array(sup.astype(sup_type, copy=False))
            )
        out.append(pa.table(cols_out))
    return pa.concat_tables(out)


# --------------------------------------------------------------------------- the feeder actor


@dataclass
class _Prepared:
    plan_hash: str
    views: list[RankView]
    refs: list[list]  # per rank: ordered block refs of its part
    parts: list  # MaterializedDatasets, kept so their blocks stay alive
    stats: dict


class Feeder:
    """Builds and holds each epoch's sorted per-rank parts; see the module docstring."""

    def __init__(
        self,
        cfg: dict,
        index: LengthIndex,
        edges: list[int],
        path: str,
        prefetch: bool = True,
        fs: pafs.FileSystem | None = None,
    ):
        import ray.data

        self.cfg = RunConfig.model_validate(cfg)
        self.index = index
        self.edges = [int(e) for e in edges]
        self.path = path
        self.prefetch = prefetch
        self.fs = fs if fs is not None else filesystem_for(path)[0]
        ctx = ray.data.DataContext.get_current()
        # Keys fix the order; preserve_order also keeps block order independent of scheduling.
        ctx.execution_options.preserve_order = True
        ctx.enable_progress_bars = False
        # Measured on 2 cores with Ray 2.60: the default (shuffle_v2) adds ~5 s of fixed
        # start-up to every sort, the pull-based sort shuffle ~0.1 s; with range boundaries
        # given, the sort is a single map-partition / reduce-merge pass either way.
        ctx.shuffle_strategy = SORT_SHUFFLE_STRATEGY
        self._lock = threading.Lock()
        self._jobs: dict[tuple, Future] = {}
        # One preparation at a time: two concurrent sorts would only compete for the same CPUs.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="feeder")

    def _submit(self, key: tuple) -> Future:
        with self._lock:
            fut = self._jobs.get(key)
            if fut is None:
                fut = self._jobs[key] = self._pool.submit(self._prepare, *key)
            return fut

    def _prepare(self, epoch: int, world_size: int, start_step: int) -> _Prepared:
        import ray
        import ray.data

        t0 = time.perf_counter()
        plan = epoch_plan_for(self.cfg, self.index, self.edges, epoch, world_size)
        full_hash = plan.content_hash
        if start_step:
            plan = plan.slice(start_step)
        keys, rank_rows = plan.sort_keys()
        units = plan_read_units(self.index, plan.sample_ids, keys)
        t_plan = time.perf_counter()
        parts: list = []
        if plan.num_samples:
            units_ref = ray.put(units)
            items = [
                {"u": j, "file_idx": int(f), "row_group": int(g)}
                for j, (f, g) in enumerate(zip(units["file_idx"], units["row_group"], strict=True))
            ]
            id_type = np.int32 if self.cfg.model.vocab_size <= np.iinfo(np.int32).max else np.int64
            ds = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
                _read_units,
                batch_size=1,
                batch_format="pyarrow",
                fn_kwargs={
                    "fs": self.fs,
                    "units_ref": [units_ref],
                    "files": self.index.files,
                    "has_sid": self.index.has_sample_id,
                    "supervision": self.index.supervision,
                    "truncate_to": self.index.truncate_to,
                    "id_type": id_type,
                },
            )
            ds = ds.sort("key", boundaries=self._boundaries(plan, rank_rows)).materialize()
            t_sort = time.perf_counter()
            cuts = np.cumsum(rank_rows)[:-1].tolist()
            parts = ds.split_at_indices([int(c) for c in cuts]) if cuts else [ds]
            refs = [p.to_arrow_refs() for p in parts]
        else:
            t_sort = time.perf_counter()
            refs = [[] for _ in range(world_size)]
        t_split = time.perf_counter()
        return _Prepared(
            plan_hash=full_hash,
            views=[plan.rank_view(r) for r in range(world_size)],
            refs=refs,
            parts=parts,
            stats={
                "epoch": epoch,
                "world_size": world_size,
                "start_step": start_step,
                "steps": plan.num_steps,
                "rows_sorted": plan.num_samples,
                "row_groups_read": int(len(units["file_idx"])),
                "plan_s": t_plan - t0,
                "sort_s": t_sort - t_plan,
                "split_s": t_split - t_sort,
                "plan_hash": full_hash,
            },
        )

    def _boundaries(self, plan, rank_rows: np.ndarray) -> list[int]:
        """Range-partition boundaries: every rank start, plus cuts for ~TARGET_BLOCK_BYTES blocks.

        Keys are 0..N-1, so these are exact and the sort needs no sampling pass.
        """
        bytes_per_row = 4 * float(plan.lengths.mean()) + 32
        rows_per_block = max(1, int(TARGET_BLOCK_BYTES // bytes_per_row))
        starts = np.concatenate([[0], np.cumsum(rank_rows)])
        cuts = [
            np.arange(s, e, rows_per_block) for s, e in zip(starts[:-1], starts[1:], strict=True)
        ]
        b = np.unique(np.concatenate([*cuts, starts[1:-1]]).astype(np.int64))
        return [int(x) for x in b if 0 < x < plan.num_samples]

    def prepare(self, epoch: int, world_size: int, start_step: int = 0) -> dict:
        """Prepare (or wait for) the parts of (epoch, world_size, start_step); returns timings."""
        return self._submit((epoch, world_size, start_step)).result().stats

    def part(self, epoch: int, world_size: int, start_step: int, rank: int) -> dict:
        """Rank `rank`'s plan view and ordered block refs; starts preparing epoch + 1."""
        prep = self._submit((epoch, world_size, start_step)).result()
        if self.prefetch and epoch + 1 < self.cfg.train.epochs:  # no sort nobody will read
            self._submit((epoch + 1, world_size, 0))
        with self._lock:  # parts of older epochs are released (workers still reading hold refs)
            for k in [k for k in self._jobs if k[0] < epoch]:
                del self._jobs[k]
        return {
            "view": prep.views[rank],
            "refs": prep.refs[rank],
            "edges": self.edges,
            "pad_id": self.cfg.data.pad_id,
            "pad_to_multiple_of": self.cfg.batching.pad_to_multiple_of,
            "supervision": self.index.supervision,
            "plan_hash": prep.plan_hash,
        }

    def status(self) -> list[dict]:
        """Stats of finished preparations and the keys still running."""
        with self._lock:
            jobs = dict(self._jobs)
        return [
            f.result().stats if f.done() and f.exception() is None else {"key": k, "done": f.done()}
            for k, f in sorted(jobs.items())
        ]


def start_feeder(
    cfg: RunConfig,
    index: LengthIndex,
    edges: list[int],
    *,
    name: str,
    path: str,
    prefetch: bool = True,
):
    """Start the named zero-CPU feeder actor on this (the driver's) node; returns its handle.

    The driver process keeps a handle, so the actor lives until `stop_feeder(name)`, a new
    feeder of the same name, or the end of the driver (a non-detached actor dies with its job).
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    stop_feeder(name)
    actor_cls = ray.remote(num_cpus=0, max_concurrency=FEEDER_MAX_CONCURRENCY)(Feeder)
    node = ray.get_runtime_context().get_node_id()
    handle = actor_cls.options(
        name=name, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
    ).remote(
        cfg.model_dump(mode="json"),
        index,
        list(edges),
        path,
        prefetch,
        # Resolved here so the actor reads with the driver's endpoint (AWS_ENDPOINT_URL), as the
        # index scan does; a pickled filesystem carries the endpoint, never the credentials.
        filesystem_for(path)[0],
    )
    _FEEDERS[name] = handle
    return handle


def stop_feeder(name: str) -> None:
    """Kill the named feeder (if any), releasing the epochs it holds in the object store."""
    import ray

    _FEEDERS.pop(name, None)
    try:
        ray.kill(ray.get_actor(name))
    except ValueError:
        pass


def _prefetched_blocks(refs: list, ahead: int = 2) -> Iterator[pa.Table]:
    """Yield the blocks in order, asking Ray to pull the next `ahead` while one is padded."""
    import ray

    for i, ref in enumerate(refs):
        nxt = refs[i + 1 : i + 1 + ahead]
        if nxt:
            ray.wait(nxt, num_returns=len(nxt), timeout=0, fetch_local=True)
        yield ray.get(ref)


def rank_batches(
    feeder_name: str,
    *,
    epoch: int,
    start_step: int,
    rank: int,
    world_size: int,
    pin_memory: bool = False,
) -> Iterator[MicroBatch]:
    """This rank's micro-batches of `epoch` from global step `start_step` on, one per step."""
    import ray

    feeder = ray.get_actor(feeder_name)
    part = ray.get(feeder.part.remote(epoch, world_size, start_step, rank))
    yield from deliver(
        part["view"],
        _prefetched_blocks(part["refs"]),
        epoch=epoch,
        edges=part["edges"],
        pad_id=part["pad_id"],
        pad_to_multiple_of=part["pad_to_multiple_of"],
        supervision=part["supervision"],
        pin_memory=pin_memory,
    )
