"""Bucket report CLI: edges, per-bucket sizes and simulated padding efficiency for a set of lengths.

    python -m jobs.plan_buckets --preset seed902k --num-buckets auto --batch-size 32 \\
        --json out/report.json --png out/report.png --dump-plan out/plan.parquet

Lengths come from the seed-calibrated preset, a 1-D integer .npy (sample id = position) or a
parquet dataset (through the Ray Data length index). The table goes to stdout, progress and
timings to stderr; a bad input is one line on stderr naming the fix, with exit code 2.
`--plan-seed` seeds the epoch plan (and the random/megabatch baselines); `--corpus-seed` seeds
the preset's lengths. No model is needed: token ids of `--data` are checked against a
vocabulary only when `--config` or `--vocab-size` gives one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from jobs._cli import count
from pipeline.core.config import (
    BatchingConfig,
    BucketsConfig,
    ConfigError,
    PlanConfig,
    load_config,
    parse_edges,
)
from pipeline.core.metrics import truncation_counts
from pipeline.core.report import build_report, plot_report, render_text
from pipeline.core.synthetic import PRESETS, seed902k_lengths

PROG = "python -m jobs.plan_buckets"
# Token ids are int32: a vocabulary this large accepts every id (no vocabulary check).
NO_VOCAB_CHECK = 2**31 - 1
DEFAULT_MAX_LENGTH = 8192  # data.max_length's default


class InputError(ValueError):
    """A problem with the command line or the input data, phrased with its fix."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not the usage block
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _num_buckets(s: str) -> int | str:
    if s == "auto":
        return s
    try:
        return int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {s!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__.splitlines()[0])
    src = p.add_argument_group("input (one of)").add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", choices=sorted(PRESETS), help="seed-calibrated synthetic lengths")
    src.add_argument(
        "--lengths-npy", metavar="PATH", help="1-D integer .npy of lengths; sample id = position"
    )
    src.add_argument(
        "--data", metavar="PATH", help="parquet dataset (dir or URI), via the length index"
    )
    p.add_argument(
        "--config",
        metavar="YAML",
        help="run config for --data (vocab size, max length, bad rows); default: no vocabulary "
        "check and the config defaults",
    )
    p.add_argument(
        "--vocab-size",
        type=count(1),
        help="--data: refuse token ids >= this (default: the --config's model.vocab_size, or none)",
    )
    p.add_argument(
        "--num-samples",
        type=count(1),
        default=PRESETS["seed902k"],
        help="preset size (default %(default)s)",
    )
    p.add_argument(
        "--corpus-seed",
        type=count(0),
        default=0,
        help="preset length generator seed, as data.synthetic.seed (default %(default)s)",
    )
    e = p.add_mutually_exclusive_group()
    e.add_argument(
        "--num-buckets", type=_num_buckets, default="auto", help="K, or 'auto' (default)"
    )
    e.add_argument("--edges", help="explicit edges, e.g. 0,770,1216,1728,2432,3296,8192")
    p.add_argument(
        "--max-buckets", type=count(1), default=64, help="upper bound on K for auto (default 64)"
    )
    p.add_argument(
        "--target-efficiency", type=float, default=0.97, help="auto target (default 0.97)"
    )
    b = p.add_mutually_exclusive_group()
    b.add_argument("--batch-size", type=count(1), help="fixed global batch size")
    b.add_argument(
        "--token-budget", type=count(1), help="padded tokens per global step (default 65536)"
    )
    p.add_argument(
        "--round-to",
        type=count(0),
        help="round token-budget batches down to this (default 8; not with --batch-size)",
    )
    p.add_argument(
        "--pad-to-multiple-of", type=count(1), default=8, help="pad batch max up to this"
    )
    p.add_argument(
        "--world-size", type=count(1), default=1, help="ranks each global batch is split over"
    )
    _add_plan_args(p)
    return p


def _add_plan_args(p: argparse.ArgumentParser) -> None:
    """Over-length handling, seeds, epoch and the output files."""
    p.add_argument(
        "--over-length",
        choices=("error", "truncate"),
        default="error",
        help="lengths above the top edge (--edges' last, else --max-length): stop, or cut them "
        "and count what is cut, as data.over_length (default error)",
    )
    p.add_argument(
        "--max-length",
        type=count(1),
        default=DEFAULT_MAX_LENGTH,
        help="top edge bound without --edges, as data.max_length (default %(default)s)",
    )
    p.add_argument(
        "--plan-seed",
        type=count(0),
        default=0,
        help="epoch plan seed, as plan.seed (also the random/megabatch policies)",
    )
    p.add_argument("--epoch", type=count(0), default=0, help="epoch to plan")
    p.add_argument("--json", metavar="OUT", help="write the report as JSON")
    p.add_argument("--png", metavar="OUT", help="write the length histogram with edges")
    p.add_argument("--dump-plan", metavar="OUT.parquet", help="write the epoch plan's rows")


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
    """The run config that decides what a valid row is; no vocabulary check unless one is given."""
    overrides = [f"data.path={path}"]
    if vocab_size is not None or config is None:
        overrides.append(f"model.vocab_size={vocab_size or NO_VOCAB_CHECK}")
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


def _check_lengths(lengths: np.ndarray, ids: np.ndarray | None, source: str) -> None:
    if lengths.size == 0:
        raise InputError(f"{source}: no samples; point at a non-empty input")
    bad = np.flatnonzero(lengths < 1)
    if bad.size:
        sid = bad if ids is None else ids[bad]
        raise InputError(
            f"{source}: {bad.size} samples have length < 1 (first sample ids {sid[:5].tolist()}); "
            "drop empty samples before planning"
        )


def _check_top_edge(top: int, lengths: np.ndarray, ids: np.ndarray | None, flag: str) -> None:
    over = np.flatnonzero(lengths > top)
    fix = "end --edges at" if flag == "--edges" else f"raise {flag} to"
    if over.size:
        sid = over if ids is None else ids[over]
        raise InputError(
            f"{over.size} samples are longer than the top edge {top} (first sample ids "
            f"{sid[:5].tolist()}, longest {int(lengths.max())}); {fix} >= {int(lengths.max())}, "
            "or pass --over-length truncate to cut them"
        )


def _configs(args) -> tuple[BatchingConfig, PlanConfig]:
    """Validate the numeric flags through the run config's own sections."""
    batching = {"pad_to_multiple_of": args.pad_to_multiple_of}
    if args.batch_size is not None:
        if args.round_to is not None:
            raise InputError("--round-to has no effect with --batch-size: drop one of them")
        batching |= {"mode": "fixed", "batch_size": args.batch_size}
    else:
        batching |= {"mode": "token_budget", "token_budget": args.token_budget or 65_536}
        batching["round_to"] = 8 if args.round_to is None else args.round_to
    buckets = {"target_efficiency": args.target_efficiency, "max_buckets": args.max_buckets}
    if args.num_buckets != "auto" and args.edges is None:
        buckets["num_buckets"] = args.num_buckets
    try:
        BucketsConfig(**buckets)
        return BatchingConfig(**batching), PlanConfig(seed=args.plan_seed)
    except ValidationError as err:
        e = err.errors()[0]
        msg = e["msg"].removeprefix("Value error, ")
        for name in ("num_buckets", "max_buckets", "target_efficiency"):
            msg = msg.replace(f"buckets.{name}", _flag(name))
        loc = [str(p) for p in e["loc"] if p not in _VARIANT_TAGS]
        if not loc:  # a cross-field rule; its message already names the flags
            raise InputError(msg) from None
        # loc[0] is the field; deeper parts name union members (e.g. 'constrained-int').
        raise InputError(f"{_flag(loc[0])}: {msg}, got {e['input']!r}") from None


# Tags pydantic puts in error locations for the variants of the buckets and batching sections.
_VARIANT_TAGS = {"explicit", "optimised", "token_budget", "fixed"}


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def run(args) -> int:
    def log(msg: str) -> None:
        print(f"[plan_buckets] {msg}", file=sys.stderr, flush=True)

    batching, plan_cfg = _configs(args)
    edges = None
    if args.edges is not None:
        try:
            edges = parse_edges(args.edges)
        except ConfigError as err:
            raise InputError(str(err).replace("buckets.edges", "--edges")) from None

    t = time.perf_counter()
    if args.data:
        log(f"building the length index of {args.data} with Ray Data (cached for the next run)")
    lengths, ids, source = load_lengths(args)
    log(f"loaded {source}: {lengths.size:,} lengths in {time.perf_counter() - t:.2f}s")
    _check_lengths(lengths, ids, source)
    top, flag = (edges[-1], "--edges") if edges is not None else (args.max_length, "--max-length")
    truncation = None
    if args.over_length == "truncate":
        truncation = {"top": top, **truncation_counts(lengths, top)}
        lengths = np.minimum(lengths, top)
    else:
        _check_top_edge(top, lengths, ids, flag)

    report, plan = build_report(
        lengths,
        batching=batching,
        edges=edges,
        num_buckets=args.num_buckets,
        target=args.target_efficiency,
        max_k=args.max_buckets,
        world_size=args.world_size,
        seed=args.plan_seed,
        epoch=args.epoch,
        plan=plan_cfg,
        sample_ids=ids,
        log=log,
    )
    report["source"] = source
    if truncation is not None:
        report["truncation"] = truncation
    print(f"source: {source}")
    print(render_text(report))

    if args.json:
        _write("--json", args.json, lambda: _text(args.json, json.dumps(report, indent=2) + "\n"))
        log(f"wrote {args.json}")
    if args.png:
        _write("--png", args.png, lambda: plot_report(report, lengths, args.png))
        log(f"wrote {args.png}")
    if args.dump_plan:
        import pyarrow as pa
        import pyarrow.parquet as pq

        t = time.perf_counter()
        table = pa.table(plan.rows())
        _write("--dump-plan", args.dump_plan, lambda: pq.write_table(table, args.dump_plan))
        log(f"wrote {args.dump_plan}: {table.num_rows:,} rows in {time.perf_counter() - t:.2f}s")
    return 0


def _text(path: str, text: str) -> None:
    Path(path).write_text(text)


def _write(flag: str, path: str, write) -> None:
    """Create the output's folder and write it; a failure names the flag and the fix."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write()
    except OSError as err:
        raise InputError(
            f"{flag} {path}: cannot write ({err.strerror or err}); choose a writable output path"
        ) from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except (InputError, ConfigError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
