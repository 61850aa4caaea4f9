"""Tokenize your own text into the parquet shards bucketray trains on (`python -m jobs.tokenize`).

Input: a directory or URI holding `.jsonl` / `.json` (one JSON object per line), `.parquet` and
`.txt` files, listed recursively in sorted order (names starting with `_` or `.` are skipped).
A document is one JSON line or one parquet row (the `text_column` field), or one whole `.txt`
file. Tokenizer: a local `tokenizer.json` (Hugging Face `tokenizers` format), loaded in each map
actor's constructor; nothing is downloaded.

Ray Data does the work: a dataset of the input files, `map_batches` with an actor pool (one
file per call), so a cluster tokenizes in parallel and one machine uses its cores. Each input
file becomes one output shard `shard-<ordinal>.parquet` with `sample_id` (int64) and
`input_ids` (list<int32>). The sample id is a hash of (file path relative to the input, row),
so re-tokenizing the same input gives the same ids, whatever else was added to the directory.

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
import sys
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
from pipeline.data.tokenize_text import TokenizeFiles

__all__ = ["MARKER", "TokenizeError", "tokenize_dataset"]

MARKER = "_bucketray_tokenize.json"


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
            if PurePosixPath(e.path).name.startswith(("shard-", MARKER)) and mine:
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
) -> dict:
    """Tokenize every input file under `src` into shards under `out`; returns the summary.
    `messages_column`: the documents are conversations in that column, rendered by the
    tokenizer folder's chat template, with a loss mask over the assistant's turns."""
    import ray

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
    _prepare_out(out)
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    ds = ray.data.from_items([{"ordinal": i, "rel": r} for i, r in enumerate(files)])
    ds = ds.map_batches(
        TokenizeFiles if messages_column is None else TokenizeConversations,
        fn_constructor_kwargs=dict(
            tokenizer=str(tokenizer),
            src=src,
            out=out,
            column=text_column if messages_column is None else messages_column,
            special=add_special_tokens,
        ),
        batch_size=1,
        batch_format="pyarrow",
        concurrency=(1, min(cpus, len(files))),
        num_cpus=1,
    )
    rows, n, tokens = [], 0, 0
    for r in ds.iter_rows():
        rows.append(r)
        n, tokens = n + len(r["lengths"]), tokens + int(np.sum(r["lengths"]))
        if progress:
            dt = time.perf_counter() - t0
            print(
                f"\rtokenize: {len(rows)}/{len(files)} files  {n:,} samples  {tokens:,} tokens  "
                f"{tokens / max(dt, 1e-9) / 1e3:,.0f} Ktok/s",
                end="" if len(rows) < len(files) else "\n",
                file=sys.stderr,
                flush=True,
            )
    errors = sorted(r["error"] for r in rows if r["error"])
    if errors:
        more = f" (and {len(errors) - 1} more files)" if len(errors) > 1 else ""
        raise TokenizeError(errors[0] + more)
    summary, lengths = _summary(rows, len(files), time.perf_counter() - t0)
    summary["skipped"] = skipped
    if summary["samples"] == 0:
        raise TokenizeError(f"no document under {src} produced a token (see {summary['problems']})")
    ofs, opath = filesystem_for(out)
    with ofs.open_output_stream(f"{opath}/{MARKER}") as f:
        meta = {**summary, "complete": True, "vocab_size": vocab, "tokenizer": str(tokenizer)}
        meta["input"] = src
        f.write(json.dumps(meta).encode())
    if png:
        _histogram(lengths, png)
    return {**summary, "vocab_size": vocab, "out": out}


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
