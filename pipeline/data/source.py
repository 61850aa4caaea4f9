"""Every `cfg.data.*` read of the index lives here: the data path (the synthetic corpus written on
first use) and the options the discovery, scan, cache and validation steps need."""

from __future__ import annotations

import os
from dataclasses import dataclass

from pipeline.core.config import RunConfig
from pipeline.data.corpus import corpus_is_current, write_corpus
from pipeline.data.textcorpus import TEXT_PRESETS, text_corpus_is_current, write_text_corpus

__all__ = ["DataOptions", "check_complete_output", "data_options", "resolve_data_path", "top_edge"]


@dataclass(frozen=True)
class DataOptions:
    """The index's view of a run config: plain values, no config objects below this line."""

    path: str
    glob: str | None  # data.glob: shard pattern relative to path; None: top-level files
    split: str | None  # data.split: keep only files of this split (train-*.parquet, ...)
    cache_dir: str | None  # data.cache_dir; None: beside the data
    quarantine: bool  # data.on_bad_rows == quarantine
    quarantine_path: str | None
    vocab_size: int
    top: int  # the longest length the buckets accept
    truncate: bool  # data.over_length == truncate
    # eval.split without data.split: the held-out split's files beside the training data are
    # not training files (jobs.tokenize --heldout writes train-* and validation-* together).
    exclude_split: str | None = None


def top_edge(cfg: RunConfig) -> int:
    """Longest length the buckets accept: the explicit top edge, else data.max_length."""
    return int(cfg.buckets.edges[-1]) if cfg.buckets.edges is not None else int(cfg.data.max_length)


def data_options(cfg: RunConfig, path: str) -> DataOptions:
    d = cfg.data
    heldout = d.synthetic is not None and d.synthetic.heldout > 0
    return DataOptions(
        path=path,
        glob=d.glob,
        split="train" if heldout else d.split,  # the held-out files are split `validation`
        cache_dir=d.cache_dir,
        quarantine=d.on_bad_rows.value == "quarantine",
        quarantine_path=d.quarantine_path,
        vocab_size=int(cfg.model.vocab_size),
        top=top_edge(cfg),
        truncate=d.over_length == "truncate",
        exclude_split=_held_out_split(cfg) if d.split is None and not heldout else None,
    )


def _held_out_split(cfg: RunConfig) -> str | None:
    return cfg.eval.split if cfg.eval is not None else None


def resolve_data_path(cfg: RunConfig) -> str:
    """data.path, or the synthetic corpus at data.synthetic.out_dir, generated on first use."""
    if cfg.data.path is not None:
        return cfg.data.path
    syn = cfg.data.synthetic
    out = os.path.abspath(syn.out_dir)
    if syn.preset in TEXT_PRESETS:  # real text: the interpreter's stdlib source, built once
        text = dict(
            preset=syn.preset,
            shards=syn.shards,
            max_samples=syn.num_samples,
            seed=syn.seed,
            heldout=syn.heldout,
        )
        if not text_corpus_is_current(out, **text):
            print(
                f"bucketray: writing the {syn.preset} text corpus to {out} (first use)", flush=True
            )
            write_text_corpus(out, **text)
        return out
    params = dict(
        preset=syn.preset,
        num_samples=syn.num_samples,
        shards=syn.shards,
        vocab_size=cfg.model.vocab_size,
        seed=syn.seed,
        heldout=syn.heldout,
    )
    if not corpus_is_current(out, **params):
        print(f"bucketray: writing the synthetic corpus to {out} (first use)", flush=True)
        write_corpus(out, progress=True, **params)
    return out


def check_complete_output(path: str) -> None:
    """Refuse a data.path that a `jobs.tokenize` run left unfinished: its marker file says
    `"complete": false` (or was cut off mid-write) until the run wrote its summary, so the
    shards there are a part of the input. A directory without a marker is not ours: fine."""
    import json

    from pipeline.data.errors import DataError
    from pipeline.data.fs import filesystem_for
    from pipeline.data.tokenize import MARKER

    fs, root = filesystem_for(path)
    marker = f"{root.rstrip('/')}/{MARKER}"
    try:
        with fs.open_input_stream(marker) as f:
            text = f.read().decode("utf-8", "replace")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return
    except OSError:
        return  # unreadable here (a single-file path, a permission): the index names it
    try:
        complete = json.loads(text).get("complete") is True
    except (ValueError, AttributeError):
        complete = False
    if not complete:
        raise DataError(
            f"data.path={path}: an incomplete jobs.tokenize output ({MARKER} says it did not "
            "finish); run jobs.tokenize again with this --out, then train"
        )
