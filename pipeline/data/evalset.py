"""The held-out set on the driver: found, indexed and checked like training data, read once.

`load_eval_set(cfg, train_index)` builds the length index of `eval.path` (or of the split
`eval.split` beside the training data) with every contract-10 check and the training run's own
rules (vocabulary, `data.over_length`, `data.on_bad_rows`, and the top edge training uses: the
optimised one is the longest training sample, often below `data.max_length`, and the model is
built for it, so held-out samples longer than it are cut there and counted, or refused, exactly
as a training sample would be), keeps `eval.max_samples` of it, refuses (or with
`eval.on_overlap=drop`, drops) held-out samples the training data holds too (the same sample id
where both datasets carry ids, or the same tokens), refuses a set with no next-token target, and
reads every held-out row into one Arrow table. That table travels to the workers once; each rank cuts its
share of the held-out plan out of it (`EvalSet.part`), as the training stream would deliver it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from pipeline.core.config import PackedBatching, RunConfig
from pipeline.core.epochs import packing_spec
from pipeline.core.evaluation import eval_plan_for, eval_subset
from pipeline.core.plan import EpochPlan, RankView
from pipeline.data.cache import cache_dir_for
from pipeline.data.errors import DataError
from pipeline.data.fs import filesystem_for, list_shards
from pipeline.data.index import LengthIndex, build_length_index
from pipeline.data.read import ReadSpec, plan_read_units, read_unit
from pipeline.data.retry import RetryPolicy
from pipeline.data.source import resolve_data_path

__all__ = [
    "EvalSet",
    "eval_data_config",
    "load_eval_set",
    "next_token_targets",
    "overlap",
    "rank_eval_batches",
    "training_top",
]

log = logging.getLogger("bucketray.data")


@dataclass(frozen=True, eq=False)
class EvalSet:
    """The held-out samples as delivered: ids ascending, lengths (truncated like training's),
    and their rows (`sample_id`, `input_ids` and, with supervision, `sup`) in that order."""

    path: str
    sample_ids: np.ndarray
    lengths: np.ndarray
    table: pa.Table
    supervision: str
    truncated: int = 0  # held-out samples cut at the top edge (data.over_length=truncate)
    dropped: int = 0  # dropped as also in the training data (eval.on_overlap=drop)
    top: int | None = None  # the training top edge the lengths were cut at

    @property
    def num_samples(self) -> int:
        return int(self.sample_ids.size)

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    def part(self, plan: EpochPlan, rank: int) -> tuple[RankView, pa.Table]:
        """Rank `rank`'s share of the held-out `plan`: its view and its rows in plan order."""
        view = plan.rank_view(rank)
        rows = np.searchsorted(self.sample_ids, view.sample_ids)
        return view, self.table.take(pa.array(rows, pa.int64()))

    def describe(self) -> str:
        extra = []
        if self.truncated:
            at = f" {self.top:,}" if self.top is not None else ""
            extra.append(f"{self.truncated:,} truncated at the top edge{at}")
        if self.dropped:
            extra.append(f"{self.dropped:,} dropped as also in the training data")
        more = f" ({'; '.join(extra)})" if extra else ""
        return (
            f"held-out set {self.path}: {self.num_samples:,} samples, {self.num_tokens:,} "
            f"tokens{more}"
        )


def eval_data_config(cfg: RunConfig, top: int | None = None) -> tuple[RunConfig, str]:
    """(a copy of `cfg` whose data section points at the held-out files, their location). The
    held-out set is indexed by the training run's rules, at the training top edge `top` (None:
    the config's); its quarantine file is its own."""
    e, d = cfg.eval, cfg.data
    if e.path is not None:
        path, split, glob = e.path, None, None
    else:  # a split beside the training data (the synthetic corpus holds out `validation`)
        path = resolve_data_path(cfg)
        split, glob = e.split, (d.glob if d.synthetic is None else None)
    quarantine = None
    if d.on_bad_rows.value == "quarantine":
        base = cache_dir_for(d.cache_dir, path, single_file=False)
        quarantine = f"{base}/quarantine-eval.parquet"
    data = d.model_copy(
        update={
            "path": path,
            "synthetic": None,
            "split": split,
            "glob": glob,
            "quarantine_path": quarantine,
            # The top edge the index cuts (or refuses) at: explicit edges already name it.
            "max_length": d.max_length if top is None else int(top),
        }
    )
    return cfg.model_copy(update={"data": data, "eval": None}), path


def training_top(cfg: RunConfig, train_index: LengthIndex) -> int:
    """The top edge a run trains at (`epochs.resolve_edges`'s last): the explicit one, else the
    longest training sample, as the optimiser chooses it."""
    if cfg.buckets.edges is not None:
        return int(cfg.buckets.edges[-1])
    return int(train_index.lengths.max())


_TOKENIZE_HINT = (
    "python -m jobs.tokenize --input HELD_OUT_TEXT --tokenizer ... --out DIR writes such a folder"
)


def _check_source(cfg: RunConfig, ecfg: RunConfig, path: str, what: str) -> None:
    """A held-out source that is missing, empty or has no file of eval.split, in one line that
    names the eval field and the fix (the index's own messages name data.path / data.split)."""
    d = ecfg.data
    fs, root = filesystem_for(path)
    try:
        if list_shards(fs, root, glob=d.glob, split=d.split):
            return
    except DataError:
        pass  # named below by the eval field, not by the index's data.* message
    if cfg.eval.path is not None:
        if fs.get_file_info(root).type == pafs.FileType.NotFound:
            raise DataError(
                f"{what} does not exist: set eval.path to a folder of held-out parquet shards "
                f"({_TOKENIZE_HINT}), or use eval.split"
            )
        raise DataError(
            f"{what} has no shards (parquet files) directly in it (subfolders are not read): "
            f"set eval.path to the folder holding the held-out shards ({_TOKENIZE_HINT})"
        )
    split = cfg.eval.split
    raise DataError(
        f"{what}: no held-out files of split {split!r} beside the training data (named like "
        f"{split}-00000.parquet or {split}.parquet): tokenize the corpus with "
        "`python -m jobs.tokenize ... --heldout 0.05` (train-* and validation-* shards, held "
        "out by source file; eval.split=validation), set eval.path to a folder of held-out "
        "shards, or remove the eval section"
    )


def next_token_targets(eval_set: EvalSet) -> int:
    """Held-out tokens with a next-token target: a sample's first token is never one, and with
    a loss mask or labels only its supervised positions are."""
    if eval_set.supervision == "":
        return int(np.maximum(eval_set.lengths - 1, 0).sum())
    col = eval_set.table["sup"].combine_chunks()
    flat = col.flatten().to_numpy(zero_copy_only=False)
    offsets = col.offsets.to_numpy()
    live = flat != (0 if eval_set.supervision == "loss_mask" else -100)
    live[offsets[:-1][np.diff(offsets) > 0]] = False  # the first token of each sample
    return int(live.sum())


def overlap(train: LengthIndex, held: LengthIndex, keep: np.ndarray) -> tuple[np.ndarray, str]:
    """Which of the held-out positions `keep` are in the training data too (bool mask), and
    what they share: the same sample id (where both datasets carry a sample_id column; derived
    ids are positions and mean nothing across datasets) or the same tokens."""
    same_id = np.zeros(keep.size, dtype=bool)
    if all(train.has_sample_id) and all(held.has_sample_id):
        same_id = np.isin(held.sample_ids[keep], train.sample_ids)
    same_tokens = np.zeros(keep.size, dtype=bool)
    if held.row_hashes.size and train.row_hashes.size:
        same_tokens = np.isin(held.row_hashes[keep], train.row_hashes)
    both = same_id | same_tokens
    ids = ", ".join(str(int(i)) for i in held.sample_ids[keep][both][:5])
    what = (
        f"{int(same_id.sum()):,} with a training sample's sample_id, "
        f"{int(same_tokens.sum()):,} with a training sample's exact tokens (e.g. sample_id {ids})"
    )
    return both, what


def _read_rows(cfg: RunConfig, index: LengthIndex, ids: np.ndarray) -> pa.Table:
    """The held-out rows with these ids (ascending), checked as training reads check them."""
    units = plan_read_units(index, ids, np.arange(ids.size, dtype=np.int64))
    spec = ReadSpec.of(index, cfg.model.vocab_size, RetryPolicy())
    fs, _ = filesystem_for(index.path)
    tables = [read_unit(fs, spec, units.unit(j))[0] for j in range(len(units))]
    t = pa.concat_tables(tables)
    t = t.take(pa.array(np.argsort(t["key"].to_numpy(), kind="stable")))
    return t.drop_columns(["key"])


def load_eval_set(cfg: RunConfig, train_index: LengthIndex, top: int | None = None) -> EvalSet:
    """Index, check and read the run's held-out set (module docstring) at the training top edge
    `top` (None: the one `train_index` gives). DataError names what is wrong and the fix."""
    e = cfg.eval
    top = training_top(cfg, train_index) if top is None else int(top)
    ecfg, path = eval_data_config(cfg, top)
    what = f"eval.path={e.path}" if e.path is not None else f"eval.split={e.split!r} under {path}"
    _check_source(cfg, ecfg, path, what)
    try:
        index = build_length_index(ecfg, path)
    except DataError as err:
        raise DataError(f"{what}: {err}") from None
    if index.num_samples == 0:
        raise DataError(f"{what}: no valid held-out samples to evaluate")
    keep = eval_subset(index.sample_ids, e.max_samples)
    both, shared = overlap(train_index, index, keep)
    dropped = int(both.sum())
    if dropped and e.on_overlap == "error":
        raise DataError(
            f"{what}: {dropped:,} of {keep.size:,} held-out samples are in the training data "
            f"too ({shared}): a held-out loss over them measures memory, not generalisation; "
            "remove them from one side, or set eval.on_overlap=drop to evaluate without them"
        )
    if dropped:
        log.warning(
            "eval: dropped %d held-out samples also in the training data (%s)", dropped, shared
        )
        keep = keep[~both]
        if keep.size == 0:
            raise DataError(f"{what}: every held-out sample is in the training data too")
    ids = index.sample_ids[keep]
    truncated = 0
    if index.untruncated_lengths is not None:
        truncated = int((index.untruncated_lengths[keep] > index.lengths[keep]).sum())
    held = EvalSet(
        path=path,
        sample_ids=ids,
        lengths=index.lengths[keep].astype(np.int64),
        table=_read_rows(cfg, index, ids),
        supervision=index.supervision,
        truncated=truncated,
        dropped=dropped,
        top=top,
    )
    if next_token_targets(held) == 0:  # else every evaluation is nan over 0 samples
        raise DataError(
            f"{what}: no next-token target in any of its {held.num_samples:,} held-out samples "
            "(each is 1 token long, or supervises no token after its first): evaluate samples "
            "of at least 2 tokens, with a supervised token after the first"
        )
    return held


def rank_eval_batches(cfg: RunConfig, eval_set: EvalSet, *, top: int, rank: int, world_size: int):
    """A function returning, afresh on each call, rank `rank`'s held-out micro-batches at
    `world_size`, collated exactly as training's (packed rows in packed mode)."""
    from pipeline.data.rechunk import deliver

    packing = packing_spec(cfg) if isinstance(cfg.batching, PackedBatching) else None
    plan = eval_plan_for(
        cfg,
        eval_set.lengths,
        eval_set.sample_ids,
        top=top,
        world_size=world_size,
        packing=packing,
    )
    view, table = eval_set.part(plan, rank)

    def batches():
        return deliver(
            view,
            [table],
            epoch=0,
            pad_id=cfg.data.pad_id,
            pad_to_multiple_of=cfg.batching.pad_to_multiple_of,
            supervision=eval_set.supervision,
        )

    return batches
