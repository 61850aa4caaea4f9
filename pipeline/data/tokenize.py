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
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import PurePosixPath

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.data.corpus import READS_NOTE, ROW_GROUP_ROWS, token_table
from pipeline.data.fs import filesystem_for
from pipeline.data.textcorpus import stable_id

__all__ = [
    "MARKER",
    "SUFFIXES",
    "TokenizeError",
    "conversation_ids_and_mask",
    "list_inputs",
    "resolve_tokenizer",
    "skipped_inputs",
    "tokenize_dataset",
]

MARKER = "_bucketray_tokenize.json"
SUFFIXES = (".jsonl", ".json", ".parquet", ".txt")
MAX_EXAMPLES = 20  # problem rows listed in the summary (all are counted)


class TokenizeError(ValueError):
    """A user mistake: the message names the file or option and the fix."""


def list_inputs(fs: pafs.FileSystem, root: str) -> list[str]:
    """Input files under `root` (relative posix paths, sorted)."""
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.File:
        return [PurePosixPath(root).name]
    if info.type != pafs.FileType.Directory:
        raise TokenizeError(f"input {root} does not exist")
    out = []
    for fi in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        rel = PurePosixPath(fi.path).relative_to(PurePosixPath(root)).as_posix()
        hidden = any(p.startswith(("_", ".")) for p in rel.split("/"))
        if fi.type == pafs.FileType.File and not hidden and rel.endswith(SUFFIXES):
            out.append(rel)
    return sorted(out)


def skipped_inputs(fs: pafs.FileSystem, root: str) -> list[list[str]]:
    """[relative path, reason] of every file under `root` that `list_inputs` does not use (a
    hidden folder once, as `name/`), so the summary accounts for every input it was given."""
    if fs.get_file_info(root).type != pafs.FileType.Directory:
        return []
    out, hidden = [], set()
    for fi in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        if fi.type != pafs.FileType.File:
            continue
        parts = PurePosixPath(fi.path).relative_to(PurePosixPath(root)).parts
        at = next((i for i, p in enumerate(parts) if p.startswith(("_", "."))), None)
        if at is not None:
            name = "/".join(parts[: at + 1]) + ("/" if at < len(parts) - 1 else "")
            if name not in hidden:
                hidden.add(name)
                out.append([name, "hidden name (starts with _ or .)"])
        elif not parts[-1].endswith(SUFFIXES):
            kind = PurePosixPath(parts[-1]).suffix or "no suffix"
            why = f"unsupported type ({kind}): inputs are {'/'.join(SUFFIXES)}"
            if kind in (".gz", ".zst", ".bz2", ".xz", ".zip"):
                why += "; decompress it first"
            out.append(["/".join(parts), why])
    return sorted(out)


def _not_json_lines(data: bytes, rel: str) -> str | None:
    """The hint for a .json file holding one JSON array, which JSON Lines cannot read."""
    if rel.endswith(".json") and data.lstrip()[:1] == b"[":
        return (
            f"{rel}: holds one JSON array; jobs.tokenize reads JSON Lines (one object per line): "
            f"convert it, e.g. jq -c '.[]' {PurePosixPath(rel).name} > "
            f"{PurePosixPath(rel).stem}.jsonl"
        )
    return None


def _column_values(data: bytes, rel: str, column: str, flag: str, holds: str) -> list:
    """One value per row of a .parquet or JSON Lines file: the row's `column`, None for a blank
    line, KeyError for an object without it, the exception for a line that does not decode.
    A corrupt parquet file, a missing parquet column or a .json array is a TokenizeError naming
    the file (and the flag that picks the column)."""
    if rel.endswith(".parquet"):
        try:
            t = pq.read_table(pa.BufferReader(data))
        except (pa.ArrowException, OSError) as e:  # pyarrow's message names no file
            raise TokenizeError(f"{rel}: not a readable parquet file ({e})") from None
        if column not in t.column_names:
            raise TokenizeError(
                f"{rel}: no column {column!r} (columns: {t.column_names}); "
                f"set {flag} to the column holding {holds}"
            )
        return t[column].to_pylist()
    hint = _not_json_lines(data, rel)
    if hint:
        raise TokenizeError(hint)
    lines = data.split(b"\n")
    if not lines[-1].strip():
        lines.pop()  # the newline that ends the last line starts no row
    values = []
    for line in lines:
        try:
            obj = json.loads(line) if line.strip() else None
            values.append(obj.get(column, KeyError) if isinstance(obj, dict) else obj)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            values.append(e)
    return values


def _unusable(row: int, value, column: str, what: str) -> tuple | None:
    """The problem of a row `_column_values` could not read (blank, no such field, not
    decodable), or None when it holds a value to check."""
    if value is None:
        return (row, "empty", f"blank line or null {what}")
    if value is KeyError:
        return (row, "undecodable", f"no field {column!r}")
    if isinstance(value, Exception):
        return (row, "undecodable", f"{type(value).__name__}: {value}")
    return None


def _documents(data: bytes, rel: str, column: str) -> tuple[list[int], list[str], list[tuple]]:
    """(rows, texts, problems) of one file; a problem is (row, kind, reason)."""
    rows, texts, problems = [], [], []
    if rel.endswith(".txt"):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            return [], [], [(0, "undecodable", f"not UTF-8 ({e.reason} at byte {e.start})")]
        return ([0], [text], []) if text.strip() else ([], [], [(0, "empty", "empty text")])
    values = _column_values(data, rel, column, "--text-column", "the text")
    for row, v in enumerate(values):
        if isinstance(v, str) and not v.strip():  # else encoded as a bare [BOS][EOS] sample
            problems.append((row, "empty", "empty text"))
        elif isinstance(v, str):
            rows.append(row)
            texts.append(v)
        else:
            problems.append(
                _unusable(row, v, column, "text")
                or (row, "undecodable", f"{column!r} is {type(v).__name__}, not text")
            )
    return rows, texts, problems


class TokenizeFiles:
    """Ray Data map_batches actor: tokenizes whole input files, writes one shard per file."""

    def __init__(self, tokenizer: str, src: str, out: str, column: str, special: bool):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(resolve_tokenizer(tokenizer)[0])
        self.src, self.out = src, out
        self.column, self.special = column, special

    def __call__(self, batch: pa.Table) -> pa.Table:
        ordinals, rels = batch["ordinal"].to_pylist(), batch["rel"].to_pylist()
        results = [self._one(i, rel) for i, rel in zip(ordinals, rels, strict=True)]
        return pa.table(
            {
                "file": [r["file"] for r in results],
                "lengths": pa.array([r["lengths"] for r in results], pa.list_(pa.int64())),
                "empty": pa.array([r["empty"] for r in results], pa.int64()),
                "undecodable": pa.array([r["undecodable"] for r in results], pa.int64()),
                "problems": [r.get("problems", "[]") for r in results],
                "error": [r["error"] for r in results],
            }
        )

    def _one(self, ordinal: int, rel: str) -> dict:
        fs, src = filesystem_for(self.src)
        path = src if fs.get_file_info(src).type == pafs.FileType.File else f"{src}/{rel}"
        try:
            with fs.open_input_file(path) as f:
                rows, texts, problems = _documents(f.read(), rel, self.column)
        except TokenizeError as e:  # a user mistake: reported by the driver in one line
            return {"file": rel, "lengths": [], "empty": 0, "undecodable": 0, "error": str(e)}
        encs = self.tok.encode_batch(texts, add_special_tokens=self.special) if texts else []
        ids = [np.asarray(e.ids, dtype=np.int32) for e in encs]
        lengths = np.fromiter((a.size for a in ids), dtype=np.int64, count=len(ids))
        problems += [(rows[i], "empty", "no tokens") for i in np.flatnonzero(lengths == 0)]
        keep = np.flatnonzero(lengths > 0)
        if keep.size:
            offsets = np.concatenate([[0], np.cumsum(lengths[keep])])
            values = np.concatenate([ids[i] for i in keep])
            sids = np.array([stable_id(rel, rows[i]) for i in keep], dtype=np.int64)
            table = token_table(sids, values, offsets)
            ofs, out = filesystem_for(self.out)
            with ofs.open_output_stream(f"{out}/shard-{ordinal:05d}.parquet") as f:
                # bounded row groups: a large file is still read by several tasks
                pq.write_table(table, f, row_group_size=ROW_GROUP_ROWS)
        problems.sort()
        return {
            "file": rel,
            "lengths": lengths[keep].tolist(),
            "empty": sum(p[1] == "empty" for p in problems),
            "undecodable": sum(p[1] == "undecodable" for p in problems),
            "problems": json.dumps([[rel, *p] for p in problems[:MAX_EXAMPLES]]),
            "error": "",
        }


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


# --------------------------------------------------------------------------- tokenizer folders
# and conversations (chat template, loss mask over the assistant's turns)


def resolve_tokenizer(path: str) -> tuple[str, str | None]:
    """(tokenizer.json, its folder or None) for `--tokenizer`: a bare tokenizer.json, or a folder
    as `AutoTokenizer.save_pretrained` writes it (tokenizer.json beside tokenizer_config.json and
    the chat template). Only a folder can render conversations."""
    p = os.path.expanduser(path)
    if os.path.isdir(p):
        tj = os.path.join(p, "tokenizer.json")
        if not os.path.isfile(tj):
            raise TokenizeError(
                f"tokenizer folder {path} has no tokenizer.json: save it with a fast tokenizer "
                "(AutoTokenizer.from_pretrained(...).save_pretrained(DIR))"
            )
        return tj, p
    return p, None


def load_chat_tokenizer(folder: str):
    """The folder's `transformers` tokenizer, for its chat template only (no download, no
    remote code)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise TokenizeError(
            "conversations need `transformers` for the chat template: pip install 'bucketray[hf]'"
        ) from None
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    if not getattr(tok, "chat_template", None):
        raise TokenizeError(
            f"tokenizer folder {folder} has no chat template (tokenizer_config.json "
            "chat_template or chat_template.jinja): conversations cannot be rendered"
        )
    return tok


def _check_messages(v) -> str | None:
    """Why `v` is not a conversation (a list of {role, content} with string values), or None."""
    if not isinstance(v, list) or not v:
        return f"not a non-empty list of messages ({type(v).__name__})"
    for i, m in enumerate(v):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            return f"message {i} has no role"
        if not isinstance(m.get("content"), str):
            return f"message {i} content is not text"
    if not any(m["role"] == "assistant" for m in v):
        return "no assistant message: nothing to train on"
    return None


def conversation_ids_and_mask(chat, tok, messages: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of `messages` rendered by the chat template, and a loss mask that is 1 exactly on
    the tokens of the assistant's turns (their content and the template's end-of-turn text).

    Each assistant turn i spans from the end of render(messages[:i], add_generation_prompt) to
    the end of render(messages[:i+1]); both must be prefixes of the whole render, or the template
    is one whose spans cannot be read this way (ValueError). A token is masked when its first
    character falls in a span. `tok` is the `tokenizers.Tokenizer` (offsets), `chat` the
    `transformers` tokenizer holding the template."""

    def render(msgs, gen=False) -> str:
        return chat.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)

    full = render(messages)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = render(messages[:i], gen=True) if i else ""
        end = render(messages[: i + 1])
        if not (full.startswith(start) and full.startswith(end) and len(start) <= len(end)):
            raise ValueError("the chat template does not render turns as prefixes of the whole")
        spans.append((len(start), len(end)))
    # The template writes its special tokens (BOS, turn markers) as text: no second BOS.
    enc = tok.encode(full, add_special_tokens=False)
    ids = np.asarray(enc.ids, dtype=np.int32)
    first = np.fromiter((o[0] for o in enc.offsets), dtype=np.int64, count=len(enc.offsets))
    mask = np.zeros(ids.size, dtype=np.int8)
    for s, e in spans:
        mask[(first >= s) & (first < e)] = 1
    return ids, mask


def _conversations(data: bytes, rel: str, column: str) -> tuple[list[int], list, list[tuple]]:
    """(rows, conversations, problems) of one .jsonl/.json/.parquet file; `column` holds a list
    of {role, content} messages."""
    if rel.endswith(".txt"):
        return [], [], [(0, "undecodable", "a .txt file holds no messages")]
    values = _column_values(data, rel, column, "--messages-column", "the list of messages")
    rows, convs, problems = [], [], []
    for row, v in enumerate(values):
        if (problem := _unusable(row, v, column, "messages")) is not None:
            problems.append(problem)
        elif (why := _check_messages(v)) is not None:
            problems.append((row, "undecodable", why))
        else:
            rows.append(row)
            convs.append(v)
    return rows, convs, problems


class TokenizeConversations(TokenizeFiles):
    """Like TokenizeFiles, for conversation data: each document is a list of messages, rendered
    by the folder's chat template; shards get a `loss_mask` (int8) beside `input_ids`."""

    def __init__(self, tokenizer: str, src: str, out: str, column: str, special: bool):
        tj, folder = resolve_tokenizer(tokenizer)
        super().__init__(tj, src, out, column, special)
        self.chat = load_chat_tokenizer(folder)

    def _one(self, ordinal: int, rel: str) -> dict:
        fs, src = filesystem_for(self.src)
        path = src if fs.get_file_info(src).type == pafs.FileType.File else f"{src}/{rel}"
        try:
            with fs.open_input_file(path) as f:
                rows, convs, problems = _conversations(f.read(), rel, self.column)
        except TokenizeError as e:
            return {"file": rel, "lengths": [], "empty": 0, "undecodable": 0, "error": str(e)}
        kept_rows, ids, masks = [], [], []
        for row, conv in zip(rows, convs, strict=True):
            try:
                i, m = conversation_ids_and_mask(self.chat, self.tok, conv)
            except Exception as e:  # a template error on this conversation: counted, listed
                problems.append((row, "undecodable", f"chat template: {e}"))
                continue
            if i.size == 0:
                problems.append((row, "empty", "no tokens"))
                continue
            kept_rows.append(row)
            ids.append(i)
            masks.append(m)
        lengths = np.fromiter((a.size for a in ids), dtype=np.int64, count=len(ids))
        if ids:
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            sids = np.array([stable_id(rel, r) for r in kept_rows], dtype=np.int64)
            table = token_table(sids, np.concatenate(ids), offsets)
            mask = pa.ListArray.from_arrays(
                pa.array(offsets.astype(np.int32)), pa.array(np.concatenate(masks))
            )
            table = table.append_column("loss_mask", mask)
            ofs, out = filesystem_for(self.out)
            with ofs.open_output_stream(f"{out}/shard-{ordinal:05d}.parquet") as f:
                pq.write_table(table, f, row_group_size=ROW_GROUP_ROWS)
        problems.sort()
        return {
            "file": rel,
            "lengths": lengths.tolist(),
            "empty": sum(p[1] == "empty" for p in problems),
            "undecodable": sum(p[1] == "undecodable" for p in problems),
            "problems": json.dumps([[rel, *p] for p in problems[:MAX_EXAMPLES]]),
            "error": "",
        }
