"""Per-file digests of a dataset's planned samples, so a refused resume can name what changed.

An epoch's plan hash covers every sample id and length, so it tells *that* the data changed
since a checkpoint, not *where*. Each checkpoint therefore also records, per shard (named
relative to the data path), a digest of the sample ids and lengths the index keeps from it; a
resume whose plan hash differs compares those with the current ones and names the shards added,
removed or changed.
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["file_digests", "describe_changes"]

# Shards named in a refusal; the rest are counted.
_NAMED = 3


def _relative(path: str, root: str) -> str:
    root = root.rstrip("/")
    if root and path.startswith(root + "/"):
        return path[len(root) + 1 :]
    return path.rsplit("/", 1)[-1] if path == root else path


def file_digests(
    files: list[str],
    root: str,
    file_idx: np.ndarray,
    sample_ids: np.ndarray,
    lengths: np.ndarray,
) -> dict[str, str]:
    """{shard path relative to `root`: digest of its kept (sample id, length) pairs}.

    `file_idx`, `sample_ids` and `lengths` are aligned per sample (the length index's arrays);
    a shard with no kept sample still gets an entry, so removing all of its rows shows.
    """
    file_idx = np.asarray(file_idx, dtype=np.int64)
    order = np.argsort(file_idx, kind="stable")
    ids = np.ascontiguousarray(np.asarray(sample_ids, dtype=np.int64)[order])
    lens = np.ascontiguousarray(np.asarray(lengths, dtype=np.int64)[order])
    bounds = np.searchsorted(file_idx[order], np.arange(len(files) + 1))
    out = {}
    for f, path in enumerate(files):
        lo, hi = int(bounds[f]), int(bounds[f + 1])
        h = hashlib.blake2b(digest_size=8)
        h.update(ids[lo:hi].tobytes())
        h.update(lens[lo:hi].tobytes())
        out[_relative(path, root)] = h.hexdigest()
    return out


def describe_changes(old: dict[str, str], new: dict[str, str]) -> str:
    """'changed: a.parquet; added: b.parquet' for the shards that differ ('' when none do)."""
    parts = []
    for what, names in (
        ("changed", sorted(k for k in old.keys() & new.keys() if old[k] != new[k])),
        ("added", sorted(new.keys() - old.keys())),
        ("removed", sorted(old.keys() - new.keys())),
    ):
        if names:
            more = f" and {len(names) - _NAMED} more" if len(names) > _NAMED else ""
            parts.append(f"{what}: {', '.join(names[:_NAMED])}{more}")
    return "; ".join(parts)
