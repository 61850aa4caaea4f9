"""Input loading for `jobs.plan_buckets`: lengths (and sample ids) from the preset, a .npy or a
parquet dataset, and the checks on them; a bad input raises `InputError`, one line naming the fix.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.core.config import load_config
from pipeline.core.synthetic import seed902k_lengths

__all__ = [
    "NO_VOCAB_CHECK",
    "InputError",
    "check_lengths",
    "check_top_edge",
    "load_lengths",
]

# Token ids are int32: a vocabulary this large accepts every id (no vocabulary check).
NO_VOCAB_CHECK = 2**31 - 1  # "no limit" for the vocabulary and the sample length


class InputError(ValueError):
    """A problem with the command line or the input data, phrased with its fix."""


def _lengths_from_npy(path: str) -> np.ndarray:
    f = Path(path)
    if not f.is_file():
        raise InputError(f"--lengths-npy {path}: file not found; check the path")
    try:
        a = np.load(f, allow_pickle=False)
    except (ValueError, OSError) as err:
        raise InputError(
            f"--lengths-npy {path}: not a readable .npy array ({err}); save it with np.save"
        ) from None
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise InputError(
            f"--lengths-npy {path}: expected a 1-D integer array, got shape {a.shape} dtype {a.dtype}; "
            "save np.asarray(lengths, dtype=np.int32) instead"
        )
    return a.astype(np.int64)


def _data_config(path: str, config: str | None, vocab_size: int | None):
    """The run config that decides what a valid row is (vocabulary, longest sample, bad-row
    policy). Without one, any token id and any length is valid: a report on any tokenized
    dataset, no model needed."""
    overrides = [f"data.path={path}"]
    if vocab_size is not None or config is None:
        overrides.append(f"model.vocab_size={vocab_size or NO_VOCAB_CHECK}")
    if config is None:
        # The report sizes its own batches (--token-budget / --batch-size); the run's batching
        # section only has to accept the unbounded length.
        overrides += [f"data.max_length={NO_VOCAB_CHECK}", "batching.mode=fixed"]
    return load_config(config, overrides)


def _lengths_from_data(
    path: str, config: str | None, vocab_size: int | None
) -> tuple[np.ndarray, np.ndarray]:
    try:
        # Imported here: the parquet index needs Ray Data, which the other inputs do not.
        from pipeline.data import DataError, build_length_index
    except ImportError as err:
        raise InputError(
            f"--data needs pipeline.data.build_length_index, which is not available ({err}); "
            "use --lengths-npy or --preset instead"
        ) from None
    cfg = _data_config(path, config, vocab_size)
    try:
        index = build_length_index(cfg, path)
    except DataError as err:
        raise InputError(f"--data {path}: {err}") from None
    except OSError as err:  # e.g. an unreachable bucket or missing credentials
        raise InputError(f"--data {path}: cannot read the data ({err}); check the path") from None
    ids, lengths = _index_arrays(index)
    return np.asarray(lengths, dtype=np.int64), np.asarray(ids, dtype=np.int64)


def _index_arrays(index) -> tuple[np.ndarray, np.ndarray]:
    """(sample_ids, lengths) from a length index given as an object, a mapping or a table."""
    get = index.get if isinstance(index, dict) else lambda k: getattr(index, k, None)
    lengths = get("lengths")
    if lengths is None and hasattr(index, "column_names"):  # a pyarrow Table
        cols = index.column_names
        lengths = index.column("length" if "length" in cols else "lengths").to_numpy()
        ids = index.column("sample_id").to_numpy() if "sample_id" in cols else None
    else:
        ids = get("sample_ids")
    if lengths is None:
        raise InputError(
            f"length index of type {type(index).__name__} has no lengths; use --lengths-npy"
        )
    lengths = np.asarray(lengths)
    return (np.arange(lengths.size) if ids is None else np.asarray(ids)), lengths


def load_lengths(args) -> tuple[np.ndarray, np.ndarray | None, str]:
    """(lengths, sample ids or None for positions, a description of the source)."""
    if args.preset:
        return (
            seed902k_lengths(args.num_samples, args.corpus_seed).astype(np.int64),
            None,
            f"preset {args.preset} ({args.num_samples:,} samples, corpus seed {args.corpus_seed})",
        )
    if args.lengths_npy:
        return _lengths_from_npy(args.lengths_npy), None, f"lengths {args.lengths_npy}"
    lengths, ids = _lengths_from_data(args.data, args.config, args.vocab_size)
    return lengths, ids, f"data {args.data}"


def check_lengths(lengths: np.ndarray, ids: np.ndarray | None, source: str) -> None:
    if lengths.size == 0:
        raise InputError(f"{source}: no samples; point at a non-empty input")
    bad = np.flatnonzero(lengths < 1)
    if bad.size:
        sid = bad if ids is None else ids[bad]
        raise InputError(
            f"{source}: {bad.size} samples have length < 1 (first sample ids {sid[:5].tolist()}); "
            "drop empty samples before planning"
        )


def check_top_edge(top: int, lengths: np.ndarray, ids: np.ndarray | None, flag: str) -> None:
    over = np.flatnonzero(lengths > top)
    fix = "end --edges at" if flag == "--edges" else f"raise {flag} to"
    if over.size:
        sid = over if ids is None else ids[over]
        raise InputError(
            f"{over.size} samples are longer than the top edge {top} (first sample ids "
            f"{sid[:5].tolist()}, longest {int(lengths.max())}); {fix} >= {int(lengths.max())}, "
            "or pass --over-length truncate to cut them"
        )
