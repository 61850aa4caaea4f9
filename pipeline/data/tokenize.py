"""Tokenize your own text into the parquet shards bucketray trains on (`python -m jobs.tokenize`).

Input: a directory or URI holding `.jsonl` / `.json` (one JSON object per line), `.parquet` and
`.txt` files, listed recursively in sorted order (names starting with `_` or `.` are skipped).
A document is one JSON line or one parquet row (the `text_column` field), or one whole `.txt`
file. Tokenizer: a local `tokenizer.json` (Hugging Face `tokenizers` format), loaded in each map
actor's constructor; nothing is downloaded.

Ray Data does the work: a dataset of the input files, `map_batches` with an actor pool (one
file per call), so a cluster tokenizes in parallel and one machine uses its cores. Each input
file becomes one output shard `shard-<ordinal>.parquet` with `sample_id` (int64) and
`input_ids` (list<int32>). The sample id is a hash of (the input root, file path relative to
it, row): re-tokenizing the same input gives the same ids, whatever else was added to the
directory, and folders tokenized apart never share one (the root is recorded in the output's
marker as `id_namespace`). With `heldout` (a fraction) whole source files are held out as split
`validation` beside split `train` (`tokenize_split`): `train-<ordinal>.parquet` and
`validation-<ordinal>.parquet`, which `eval.split: validation` evaluates.

Empty documents (no text, only whitespace, or no token) and undecodable ones (bad JSON or UTF-8,
a missing or non-string text field) are not written, and are counted and listed (file, row,
reason) in the summary -- never silently dropped. So are input files that are not read (other
suffixes such as `.gz` or `.md`, hidden names): the summary's `skipped` lists each with its
reason. A `.json` file holding one JSON array, a parquet file that cannot be read, and an
`--out` inside `--input` are refused in one line naming the file.

This module is the job's driver side (the output directory, the Ray Data pass, the summary);
plain text is read and encoded in `tokenize_text`, conversations in `tokenize_chat`, and what
both share of an input file in `tokenize_io`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import PurePosixPath

import numpy as np
import pyarrow.fs as pafs

from pipeline.data.corpus import READS_NOTE, ROW_GROUP_ROWS
from pipeline.data.fs import filesystem_for
from pipeline.data.tokenize_chat import TokenizeConversations, load_chat_tokenizer
from pipeline.data.tokenize_io import (
    MAX_EXAMPLES,
    SUFFIXES,
    TokenizeError,
    list_inputs,
    resolve_tokenizer,
    skipped_inputs,
)
from pipeline.data.tokenize_split import (
    HELDOUT_SPLIT,
    TRAIN_SPLIT,
    Progress,
    drop_heldout_duplicates,
    heldout_files_of,
)
from pipeline.data.tokenize_text import TokenizeFiles

__all__ = ["MARKER", "TokenizeError", "tokenize_dataset"]

MARKER = "_bucketray_tokenize.json"
# The files a run writes, removed when it writes into its own output again.
_OURS = ("shard-", f"{TRAIN_SPLIT}-", f"{HELDOUT_SPLIT}-", MARKER)


def _refuse_out_inside_input(src: str, out: str) -> None:
    """--out inside --input: the next run would read the shards as input (and clear them)."""
    s, o = PurePosixPath(src.rstrip("/")), PurePosixPath(out.rstrip("/"))
    if o == s or s in o.parents:
        raise TokenizeError(
            f"--out {out} is inside --input {src}: the output would be read as input by the "
            "next run; choose an --out outside the input directory"
        )


def _prepare_out(out: str) -> None:
    fs, path = filesystem_for(out)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        mine = fs.get_file_info(f"{path}/{MARKER}").type == pafs.FileType.File
        entries = fs.get_file_info(pafs.FileSelector(path))
        foreign = [e for e in entries if not PurePosixPath(e.path).name.startswith(("_", "."))]
        if foreign and not mine:
            raise TokenizeError(
                f"output {out} already holds files not written by jobs.tokenize "
                f"({PurePosixPath(foreign[0].path).name}, ...): choose an empty --out directory"
            )
        for e in entries:
            if PurePosixPath(e.path).name.startswith(_OURS) and mine:
                fs.delete_file(e.path)
    fs.create_dir(path, recursive=True)
    with fs.open_output_stream(f"{path}/{MARKER}") as f:  # ours, not complete until the summary
        f.write(json.dumps({"complete": False}).encode())


def _summary(rows: list[dict], n_files: int, seconds: float) -> dict:
    parts = [np.asarray(r["lengths"], dtype=np.int64) for r in rows]
    lengths = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    pct = np.percentile(lengths, [50, 90, 99]) if lengths.size else [0, 0, 0]
    problems = [p for r in rows for p in json.loads(r["problems"])]
    return {
        "files": n_files,
        "samples": int(lengths.size),
        "tokens": int(lengths.sum()),
        "length_min": int(lengths.min()) if lengths.size else 0,
        "length_p50": float(pct[0]),
        "length_p90": float(pct[1]),
        "length_p99": float(pct[2]),
        "length_max": int(lengths.max()) if lengths.size else 0,
        "empty": int(sum(r["empty"] for r in rows)),
        "undecodable": int(sum(r["undecodable"] for r in rows)),
        "problems": sorted(problems)[:MAX_EXAMPLES],
        "seconds": round(seconds, 2),
        "row_group_rows": ROW_GROUP_ROWS,
        "reads": READS_NOTE,
    }, lengths


def tokenize_dataset(
    src: str,
    tokenizer: str,
    out: str,
    *,
    text_column: str = "text",
    add_special_tokens: bool = True,
    png: str | None = None,
    progress: bool = True,
    messages_column: str | None = None,
    heldout: float = 0.0,
) -> dict:
    """Tokenize every input file under `src` into shards under `out`; returns the summary.
    `messages_column`: the documents are conversations in that column, rendered by the
    tokenizer folder's chat template, with a loss mask over the assistant's turns. `heldout`:
    hold out this fraction of the source files as split `validation` (module docstring)."""

    t0 = time.perf_counter()
    try:
        from tokenizers import Tokenizer

        tj, folder = resolve_tokenizer(str(tokenizer))
        vocab = Tokenizer.from_file(tj).get_vocab_size(with_added_tokens=True)
    except ImportError:
        raise TokenizeError(
            "jobs.tokenize needs `tokenizers`: pip install 'bucketray[hf]'"
        ) from None
    except TokenizeError:
        raise
    except Exception as e:
        raise TokenizeError(f"cannot load tokenizer {tokenizer}: {e}") from None
    if messages_column is not None:
        if folder is None:
            raise TokenizeError(
                f"--messages-column needs a tokenizer folder with a chat template, not the bare "
                f"file {tokenizer}: pass the folder AutoTokenizer.save_pretrained wrote"
            )
        load_chat_tokenizer(folder)  # fails here, in one line, rather than in every actor
    # Absolute on the driver: the map actors may run in another working directory or node.
    src, out, tokenizer = (p if "://" in p else os.path.abspath(p) for p in (src, out, tokenizer))
    _refuse_out_inside_input(src, out)
    fs, root = filesystem_for(src)
    files = list_inputs(fs, root)
    skipped = skipped_inputs(fs, root)
    if not files:
        raise TokenizeError(f"no {'/'.join(SUFFIXES)} files under {src} (skipped: {skipped[:5]})")
    held = heldout_files_of(files, heldout) if heldout else set()
    _prepare_out(out)
    quiet_ray_data()
    split = (lambda r: HELDOUT_SPLIT if r in held else TRAIN_SPLIT) if heldout else None
    items = [
        {"ordinal": i, "rel": r, "prefix": split(r) if split else "shard"}
        for i, r in enumerate(files)
    ]
    actor = TokenizeFiles if messages_column is None else TokenizeConversations
    column = text_column if messages_column is None else messages_column
    kwargs = dict(tokenizer=str(tokenizer), src=src, out=out, column=column)
    ds = _file_pass(items, actor, {**kwargs, "special": add_special_tokens})
    rows, shown = [], Progress(len(files)) if progress else None
    for r in ds.iter_rows():
        rows.append(dict(r))
        if shown is not None:
            shown.update(len(r["lengths"]), int(np.sum(r["lengths"])))
    errors = sorted(r["error"] for r in rows if r["error"])
    if errors:
        more = f" (and {len(errors) - 1} more files)" if len(errors) > 1 else ""
        raise TokenizeError(errors[0] + more)
    split_info = _split_summary(out, rows, held) if heldout else {}
    summary, lengths = _summary(rows, len(files), time.perf_counter() - t0)
    summary["skipped"] = skipped
    summary.update(split_info)
    if summary["samples"] == 0:
        raise TokenizeError(f"no document under {src} produced a token (see {summary['problems']})")
    ofs, opath = filesystem_for(out)
    with ofs.open_output_stream(f"{opath}/{MARKER}") as f:
        meta = {**summary, "complete": True, "vocab_size": vocab, "tokenizer": str(tokenizer)}
        meta["input"] = src
        meta["id_namespace"] = src  # sample ids hash (this, file path under it, row)
        f.write(json.dumps(meta).encode())
    if png:
        _histogram(lengths, png)
    return {**summary, "vocab_size": vocab, "out": out}


def _file_pass(items: list[dict], actor: type, kwargs: dict):
    """The Ray Data pass: one input file per call of a pool of `actor`s, one CPU each."""
    import warnings

    import ray

    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    with warnings.catch_warnings():
        # max_restarts has no named parameter: Ray Data's own docs pass it this way.
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*is deprecated")
        return ray.data.from_items(items).map_batches(
            actor,
            fn_constructor_kwargs=kwargs,
            batch_size=1,
            batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(min_size=1, max_size=min(cpus, len(items))),
            num_cpus=1,
            # No restarts: Ray's core worker logs an error line for every restartable actor
            # whose constructor arguments sit in the object store. A lost actor ends the job;
            # run it again into the same --out.
            max_restarts=0,
        )


def quiet_ray_data() -> None:
    """Ray Data's progress and execution logging off: the job prints its own progress lines."""
    import logging

    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    ctx.enable_auto_log_stats = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)


def _split_summary(out: str, rows: list[dict], held: set[str]) -> dict:
    """The held-out split's counts (held-out documents with a training document's exact tokens
    dropped first: every run would refuse them as a leak)."""
    dropped = drop_heldout_duplicates(out, rows, held)
    n_held = sum(len(r["lengths"]) for r in rows if r["file"] in held)
    n_train = sum(len(r["lengths"]) for r in rows if r["file"] not in held)
    if not n_held or not n_train:
        raise TokenizeError(
            f"--heldout leaves {n_train} training and {n_held} held-out documents (held-out "
            f"files: {sorted(held)[:5]}): choose a fraction, or files, that leave both non-empty"
        )
    return {
        "train_samples": n_train,
        "heldout_samples": n_held,
        "heldout_files": sorted(held),
        "heldout_duplicates_dropped": dropped,
    }


def _histogram(lengths: np.ndarray, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.hist(lengths, bins=min(100, max(10, lengths.size // 20)), color="#4c72b0")
    ax.set_xlabel("tokens per sample")
    ax.set_ylabel("samples")
    p50, p99 = np.percentile(lengths, [50, 99])
    ax.set_title(f"{lengths.size:,} samples, median {p50:.0f}, p99 {p99:.0f} tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
