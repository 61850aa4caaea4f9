"""The file side of `jobs.tokenize`, shared by plain text and conversations: which input files
are read (and why the others are not), one file's column of values, the tokenizer's location,
and one file's shard and result row.

A corrupt parquet file, a missing column or a `.json` array is a TokenizeError naming the file;
a row that cannot be used is a problem (row, kind, reason), counted and listed, never dropped
silently.
"""

from __future__ import annotations

import json
import os
from pathlib import PurePosixPath

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.data.corpus import ROW_GROUP_ROWS
from pipeline.data.fs import filesystem_for

__all__ = [
    "MAX_EXAMPLES",
    "SUFFIXES",
    "TokenizeError",
    "column_values",
    "error_result",
    "file_result",
    "list_inputs",
    "read_input",
    "resolve_tokenizer",
    "skipped_inputs",
    "unusable",
    "write_shard",
]

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


def read_input(src: str, rel: str) -> bytes:
    """The bytes of input file `rel` under `src` (or of `src` itself, a single input file)."""
    fs, root = filesystem_for(src)
    path = root if fs.get_file_info(root).type == pafs.FileType.File else f"{root}/{rel}"
    with fs.open_input_file(path) as f:
        return f.read()


def _not_json_lines(data: bytes, rel: str) -> str | None:
    """The hint for a .json file holding one JSON array, which JSON Lines cannot read."""
    if rel.endswith(".json") and data.lstrip()[:1] == b"[":
        return (
            f"{rel}: holds one JSON array; jobs.tokenize reads JSON Lines (one object per line): "
            f"convert it, e.g. jq -c '.[]' {PurePosixPath(rel).name} > "
            f"{PurePosixPath(rel).stem}.jsonl"
        )
    return None


def column_values(data: bytes, rel: str, column: str, flag: str, holds: str) -> list:
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


def unusable(row: int, value, column: str, what: str) -> tuple | None:
    """The problem of a row `column_values` could not read (blank, no such field, not
    decodable), or None when it holds a value to check."""
    if value is None:
        return (row, "empty", f"blank line or null {what}")
    if value is KeyError:
        return (row, "undecodable", f"no field {column!r}")
    if isinstance(value, Exception):
        return (row, "undecodable", f"{type(value).__name__}: {value}")
    return None


def write_shard(out: str, ordinal: int, table: pa.Table, prefix: str = "shard") -> None:
    """Input file number `ordinal`'s shard, `<prefix>-<ordinal>.parquet` under `out` (`shard`,
    or with --heldout its split: `train` or `validation`)."""
    ofs, root = filesystem_for(out)
    with ofs.open_output_stream(f"{root}/{prefix}-{ordinal:05d}.parquet") as f:
        # bounded row groups: a large file is still read by several tasks
        pq.write_table(table, f, row_group_size=ROW_GROUP_ROWS)


def file_result(
    rel: str, lengths: list[int], problems: list[tuple], hashes: list[int] | None = None
) -> dict:
    """One input file's row of the job's result: its samples' lengths, their token hashes (to
    find held-out duplicates of training documents) and its problems (counted by kind, the
    first MAX_EXAMPLES listed)."""
    problems = sorted(problems)
    return {
        "file": rel,
        "lengths": lengths,
        "hashes": list(hashes or []),
        "empty": sum(p[1] == "empty" for p in problems),
        "undecodable": sum(p[1] == "undecodable" for p in problems),
        "problems": json.dumps([[rel, *p] for p in problems[:MAX_EXAMPLES]]),
        "error": "",
    }


def error_result(rel: str, error: TokenizeError) -> dict:
    """An input file refused as a whole: the driver reports it in one line."""
    return {"file": rel, "lengths": [], "hashes": [], "empty": 0, "undecodable": 0,
            "error": str(error)}  # fmt: skip
