"""Filesystems and shard discovery: which files of data.path are the dataset.

Discovery is explicit. By default the shards are the files directly in data.path (a backup copy
in a subfolder is not trained); `data.glob` selects files below it by pattern (`*` within one
folder, `**` across folders) and `data.split` keeps one split's files (`train-00000.parquet`,
`train.parquet`, ...). Files or folders starting with `_` or `.` are never shards (Spark, Ray and
Hive markers, our own `_bucketray_index`); any other selected file is a shard, so a stray
non-parquet file is reported instead of ignored.
"""

from __future__ import annotations

import os
import re

import pyarrow.fs as pafs

from pipeline.data.errors import DataError

__all__ = ["filesystem_for", "list_shards", "split_of"]

# Split names as Hugging Face and most exports spell them, longest first for the alternation.
_SPLIT = re.compile(r"^(validation|valid|train|test|eval|val|dev)(?=[-_.]|$)", re.IGNORECASE)


def filesystem_for(path: str) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, path inside it) for a local path or any URI pyarrow understands."""
    if "://" in path:
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), os.path.abspath(path)


def split_of(name: str) -> str | None:
    """The split a shard's file name names (`train-00000-of-00004.parquet` -> `train`), or None."""
    m = _SPLIT.match(name.rsplit("/", 1)[-1])
    return m.group(1).lower() if m else None


def _glob_regex(pattern: str) -> re.Pattern:
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        else:
            c = pattern[i]
            out.append("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c))
            i += 1
    return re.compile("".join(out) + r"\Z")


def _files(fs: pafs.FileSystem, root: str, recursive: bool) -> list[tuple[str, pafs.FileInfo]]:
    out = []
    for fi in fs.get_file_info(pafs.FileSelector(root, recursive=recursive)):
        rel = fi.path[len(root) :].lstrip("/")
        if fi.type == pafs.FileType.File and not any(
            part.startswith(("_", ".")) for part in rel.split("/")
        ):
            out.append((rel, fi))
    return out


def _examples(rels: list[str], k: int = 3) -> str:
    more = f", ... ({len(rels)} files)" if len(rels) > k else ""
    return ", ".join(rels[:k]) + more


def list_shards(
    fs: pafs.FileSystem,
    root: str,
    glob: str | None = None,
    split: str | None = None,
    exclude: str | None = None,
) -> list[pafs.FileInfo]:
    """The dataset's shards under `root` (a directory, or one file), sorted by path; `exclude`:
    a split whose files are not the dataset's (the held-out split beside the training files).

    Raises DataError naming the fix when the path is missing, when the shards sit only in
    subfolders and no data.glob says which, or when files of several splits are mixed and no
    data.split (or data.glob) picks one.
    """
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.File:
        return [info]
    if info.type != pafs.FileType.Directory:
        raise DataError(f"data path {root} does not exist (data.path)")
    root = root.rstrip("/")
    if glob is not None:
        rx = _glob_regex(glob.lstrip("/"))
        found = [(r, f) for r, f in _files(fs, root, recursive=True) if rx.match(r)]
    else:
        found = _files(fs, root, recursive=False)
        if not found:
            below = [r for r, _ in _files(fs, root, recursive=True)]
            if below:
                raise DataError(
                    f"no shards directly in {root}, but {len(below)} file(s) in subfolders "
                    f"({_examples(sorted(below))}): subfolders are not read by default; select "
                    "them with data.glob (e.g. data.glob='data/*.parquet' or '**/*.parquet')"
                )
    if exclude is not None:
        found = [(r, f) for r, f in found if split_of(r) != exclude.lower()]
    if split is not None:
        found = [(r, f) for r, f in found if split_of(r) == split.lower()]
        if not found:
            raise DataError(
                f"no shards of split {split!r} (data.split) under {root}"
                + (f" matching data.glob={glob!r}" if glob else "")
                + ": split files are named like train-00000.parquet or train.parquet"
            )
    else:
        by_split: dict[str, list[str]] = {}
        for r, _ in found:
            if (s := split_of(r)) is not None:
                by_split.setdefault(s, []).append(r)
        if len(by_split) > 1:
            named = "; ".join(f"{s}: {_examples(sorted(r))}" for s, r in sorted(by_split.items()))
            raise DataError(
                f"{root} mixes the files of {len(by_split)} splits ({named}): set data.split "
                f"(e.g. data.split={'train' if 'train' in by_split else sorted(by_split)[0]}) "
                "or data.glob to choose the files to train on"
            )
    return sorted((f for _, f in found), key=lambda f: f.path)
