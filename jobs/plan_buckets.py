"""Bucket report CLI: edges, per-bucket sizes and simulated padding efficiency for a set of lengths.

    python -m jobs.plan_buckets --preset seed902k --num-buckets auto --batch-size 32 \\
        --json out/report.json --png out/report.png --dump-plan out/plan.parquet

Lengths come from the seed-calibrated preset, a 1-D integer .npy (sample id = position) or a
parquet dataset (through the Ray Data length index). The table goes to stdout, progress and
timings to stderr; a bad input is one line on stderr naming the fix, with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from pipeline.core.config import (
    BatchingConfig,
    BucketsConfig,
    ConfigError,
    PlanConfig,
    load_config,
    parse_edges,
)
from pipeline.core.frontier import FrontierPoint, frontier_ks, plot_frontier
from pipeline.core.report import build_report, plot_report, render_text
from pipeline.core.synthetic import PRESETS, seed902k_lengths

PROG = "python -m jobs.plan_buckets"


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
        help="run config for --data (vocab size, max length, bad rows); default: built-in defaults",
    )
    p.add_argument(
        "--num-samples",
        type=int,
        default=PRESETS["seed902k"],
        help="preset size (default %(default)s)",
    )
    p.add_argument(
        "--data-seed", type=int, default=0, help="preset generator seed (default %(default)s)"
    )
    e = p.add_mutually_exclusive_group()
    e.add_argument(
        "--num-buckets", type=_num_buckets, default="auto", help="K, or 'auto' (default)"
    )
    e.add_argument("--edges", help="explicit edges, e.g. 0,770,1216,1728,2432,3296,8192")
    p.add_argument(
        "--max-buckets", type=int, default=64, help="upper bound on K for auto (default 64)"
    )
    p.add_argument(
        "--target-efficiency", type=float, default=0.97, help="auto target (default 0.97)"
    )
    b = p.add_mutually_exclusive_group()
    b.add_argument("--batch-size", type=int, help="fixed global batch size")
    b.add_argument("--token-budget", type=int, help="padded tokens per global step (default 65536)")
    p.add_argument(
        "--round-to",
        type=int,
        default=None,
        help="round token-budget batches down to this (default: 8 per bucket, none greedy)",
    )
    p.add_argument(
        "--fill",
        choices=["greedy", "fixed_per_bucket"],
        default="greedy",
        help="token budget: fill each batch to the budget (default) or budget // upper edge",
    )
    p.add_argument(
        "--max-recomposition-floor",
        type=float,
        default=None,
        help="auto: cap K where the recomposition chance floor exceeds this",
    )
    p.add_argument("--pad-to-multiple-of", type=int, default=8, help="pad batch max up to this")
    p.add_argument(
        "--world-size", type=int, default=1, help="ranks each global batch is split over"
    )
    p.add_argument(
        "--seed", type=int, default=0, help="plan seed (also the random/megabatch policies)"
    )
    p.add_argument("--epoch", type=int, default=0, help="epoch to plan")
    p.add_argument("--json", metavar="OUT", help="write the report as JSON")
    p.add_argument("--png", metavar="OUT", help="write the length histogram with edges")
    p.add_argument(
        "--frontier-png",
        metavar="OUT",
        help="write the K frontier: padding efficiency, steps and recomposition floor per K",
    )
    p.add_argument("--dump-plan", metavar="OUT.parquet", help="write the epoch plan's rows")
    return p


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


def _lengths_from_data(path: str, config: str | None) -> tuple[np.ndarray, np.ndarray]:
    try:
        # Imported here: the parquet index needs Ray Data, which the other inputs do not.
        from pipeline.data import DataError, build_length_index
    except ImportError as err:
        raise InputError(
            f"--data needs pipeline.data.build_length_index, which is not available ({err}); "
            "use --lengths-npy or --preset instead"
        ) from None
    # The run config decides what a valid row is (vocab size, max length, bad-row policy).
    cfg = load_config(config, [f"data.path={json.dumps(path)}"])
    try:
        index = build_length_index(cfg, path)
    except DataError as err:
        raise InputError(f"--data {path}: {err}") from None
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
        if args.num_samples < 1:
            raise InputError(f"--num-samples must be >= 1, got {args.num_samples}")
        return (
            seed902k_lengths(args.num_samples, args.data_seed).astype(np.int64),
            None,
            (f"preset {args.preset} ({args.num_samples:,} samples, data seed {args.data_seed})"),
        )
    if args.lengths_npy:
        return _lengths_from_npy(args.lengths_npy), None, f"lengths {args.lengths_npy}"
    lengths, ids = _lengths_from_data(args.data, args.config)
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


def _check_top_edge(edges: list[int], lengths: np.ndarray, ids: np.ndarray | None) -> None:
    over = np.flatnonzero(lengths > edges[-1])
    if over.size:
        sid = over if ids is None else ids[over]
        raise InputError(
            f"{over.size} samples are longer than the top edge {edges[-1]} (first sample ids "
            f"{sid[:5].tolist()}, longest {int(lengths.max())}); end --edges at >= {int(lengths.max())}"
        )


def _configs(args) -> tuple[BatchingConfig, PlanConfig]:
    """Validate the numeric flags through the run config's own sections."""
    batching = {
        "pad_to_multiple_of": args.pad_to_multiple_of,
        "round_to": args.round_to,
        "fill": args.fill,
    }
    if args.batch_size is not None:
        batching |= {"mode": "fixed", "batch_size": args.batch_size}
    else:
        batching |= {"mode": "token_budget", "token_budget": args.token_budget or 65_536}
    buckets = {
        "target_efficiency": args.target_efficiency,
        "max_buckets": args.max_buckets,
        "max_recomposition_floor": args.max_recomposition_floor,
    }
    if args.num_buckets != "auto" and args.edges is None:
        buckets["num_buckets"] = args.num_buckets
    try:
        BucketsConfig.model_validate(buckets)
        return BatchingConfig.model_validate(batching), PlanConfig(seed=args.seed)
    except ValidationError as err:
        e = err.errors()[0]
        msg = e["msg"].removeprefix("Value error, ")
        for name in ("num_buckets", "max_buckets", "target_efficiency", "max_recomposition_floor"):
            msg = msg.replace(f"buckets.{name}", _flag(name))
        if not e["loc"]:  # a cross-field rule; its message already names the flags
            raise InputError(msg) from None
        # loc[0] is the field; deeper parts name union members (e.g. 'constrained-int').
        raise InputError(f"{_flag(str(e['loc'][0]))}: {msg}, got {e['input']!r}") from None


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def run(args) -> int:
    def log(msg: str) -> None:
        print(f"[plan_buckets] {msg}", file=sys.stderr, flush=True)

    if args.world_size < 1:
        raise InputError(f"--world-size must be >= 1, got {args.world_size}")
    if args.seed < 0 or args.epoch < 0:
        raise InputError("--seed and --epoch must be >= 0")
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
    if edges is not None:
        _check_top_edge(edges, lengths, ids)

    report, plan = build_report(
        lengths,
        batching=batching,
        edges=edges,
        num_buckets=args.num_buckets,
        target=args.target_efficiency,
        max_k=args.max_buckets,
        world_size=args.world_size,
        seed=args.seed,
        epoch=args.epoch,
        plan=plan_cfg,
        sample_ids=ids,
        max_floor=args.max_recomposition_floor,
        frontier_ks=frontier_ks(args.max_buckets) if args.frontier_png else (),
        log=log,
    )
    report["source"] = source
    print(f"source: {source}")
    print(render_text(report))

    if args.json:
        _parent(args.json)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        log(f"wrote {args.json}")
    if args.png:
        _parent(args.png)
        plot_report(report, lengths, args.png)
        log(f"wrote {args.png}")
    if args.frontier_png:
        _parent(args.frontier_png)
        points = [FrontierPoint(**p) for p in report["frontier"]]
        plot_frontier(points, args.frontier_png, chosen=report["chosen"]["num_buckets"])
        log(f"wrote {args.frontier_png}")
    if args.dump_plan:
        import pyarrow as pa
        import pyarrow.parquet as pq

        _parent(args.dump_plan)
        t = time.perf_counter()
        table = pa.table(plan.rows())
        pq.write_table(table, args.dump_plan)
        log(f"wrote {args.dump_plan}: {table.num_rows:,} rows in {time.perf_counter() - t:.2f}s")
    return 0


def _parent(path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except (InputError, ConfigError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # an output path that cannot be written
        print(f"{PROG}: error: {err}; choose a writable output path", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
