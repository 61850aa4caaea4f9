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
from jobs._plan_inputs import (
    DEFAULT_MAX_LENGTH,
    InputError,
    check_lengths,
    check_top_edge,
    load_lengths,
    max_length_bound,
)
from pipeline.core.buckets import optimize
from pipeline.core.config import (
    BatchingConfig,
    BucketsConfig,
    ConfigError,
    ModelConfig,
    PlanConfig,
    parse_edges,
)
from pipeline.core.frontier import FrontierPoint, frontier_ks
from pipeline.core.metrics import truncation_counts
from pipeline.core.packing import PackingSpec, attention_width_for, pack_epoch, packed_summary
from pipeline.core.synthetic import PRESETS
from pipeline.report.build import build_report
from pipeline.report.plot import plot_frontier, plot_report
from pipeline.report.text import render_text

PROG = "python -m jobs.plan_buckets"


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
        "--fill",
        choices=["greedy", "fixed_per_bucket"],
        help="token budget: fill each batch to the budget (default greedy) or budget // upper "
        "edge (not with --batch-size)",
    )
    p.add_argument(
        "--max-recomposition-floor",
        type=float,
        default=None,
        help="auto: cap K where the recomposition chance floor exceeds this",
    )
    p.add_argument(
        "--round-to",
        type=count(0),
        help="round token-budget batches down to this (default: 8 with --fill fixed_per_bucket, "
        "none greedy; not with --batch-size)",
    )
    p.add_argument(
        "--pad-to-multiple-of", type=count(1), default=8, help="pad batch max up to this"
    )
    p.add_argument(
        "--world-size", type=count(1), default=1, help="ranks each global batch is split over"
    )
    _add_packed_args(p)
    _add_plan_args(p)
    return p


def _add_packed_args(p: argparse.ArgumentParser) -> None:
    """batching.mode=packed: with --row-tokens, the report adds the packed epoch (and
    --dump-plan writes it), packed as a run with the same batching fields would pack it."""
    g = p.add_argument_group("packed rows (batching.mode=packed)")
    g.add_argument(
        "--row-tokens",
        type=count(1),
        help="report the packed epoch too: tokens per row, as batching.row_tokens",
    )
    g.add_argument(
        "--rows-per-step", type=count(1), default=8, help="rows per global step (default 8)"
    )
    g.add_argument("--open-rows", type=count(1), default=16, help="best-fit window (default 16)")
    g.add_argument(
        "--balance-rows", type=count(1), default=512, help="balancing window (default 512)"
    )
    g.add_argument(
        "--attention-width",
        type=count(1),
        default=None,
        help="the cost model's width (default 6 x model.d_model's default, as the run's null)",
    )


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
        default=None,
        help="top edge bound without --edges, as data.max_length (default: --config's "
        f"data.max_length; for --data without --config the longest sample; else {DEFAULT_MAX_LENGTH})",
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
    p.add_argument(
        "--frontier-png",
        metavar="OUT",
        help="write the K frontier: padding efficiency, steps and recomposition floor per K",
    )
    p.add_argument("--dump-plan", metavar="OUT.parquet", help="write the epoch plan's rows")


def _configs(args) -> tuple[BatchingConfig, PlanConfig]:
    """Validate the numeric flags through the run config's own sections."""
    batching = {"pad_to_multiple_of": args.pad_to_multiple_of}
    if args.batch_size is not None:
        if args.round_to is not None:
            raise InputError("--round-to has no effect with --batch-size: drop one of them")
        if args.fill is not None:
            raise InputError("--fill has no effect with --batch-size: drop one of them")
        batching |= {"mode": "fixed", "batch_size": args.batch_size}
    else:
        batching |= {"mode": "token_budget", "token_budget": args.token_budget or 65_536}
        if args.round_to is not None:
            batching["round_to"] = args.round_to
        if args.fill is not None:
            batching["fill"] = args.fill
    buckets = {
        "target_efficiency": args.target_efficiency,
        "max_buckets": args.max_buckets,
        "max_recomposition_floor": args.max_recomposition_floor,
    }
    if args.num_buckets != "auto" and args.edges is None:
        buckets["num_buckets"] = args.num_buckets
    try:
        BucketsConfig(**buckets)
        return BatchingConfig(**batching), PlanConfig(seed=args.plan_seed)
    except ValidationError as err:
        e = err.errors()[0]
        msg = e["msg"].removeprefix("Value error, ")
        for name in ("num_buckets", "max_buckets", "target_efficiency", "max_recomposition_floor"):
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
    check_lengths(lengths, ids, source)
    top, flag = (
        (edges[-1], "--edges")
        if edges is not None
        else (max_length_bound(args, lengths), "--max-length")
    )
    truncation = None
    if args.over_length == "truncate":
        truncation = {"top": top, **truncation_counts(lengths, top)}
        lengths = np.minimum(lengths, top)
    else:
        check_top_edge(top, lengths, ids, flag)

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
        max_floor=args.max_recomposition_floor,
        frontier_ks=frontier_ks(args.max_buckets) if args.frontier_png else (),
        log=log,
    )
    report["source"] = source
    if truncation is not None:
        report["truncation"] = truncation
    print(f"source: {source}")
    print(render_text(report))
    if args.row_tokens is not None:
        packed_edges = _packed_edges(args, edges, lengths)
        plan, report["packed"] = _packed_report(args, lengths, ids, packed_edges, log)
        print(_packed_text(report["packed"]))

    if args.json:
        _write("--json", args.json, lambda: _text(args.json, json.dumps(report, indent=2) + "\n"))
        log(f"wrote {args.json}")
    if args.png:
        _write("--png", args.png, lambda: plot_report(report, lengths, args.png))
        log(f"wrote {args.png}")
    if args.frontier_png:
        points = [FrontierPoint(**p) for p in report["frontier"]]
        chosen = report["chosen"]["num_buckets"]
        _write(
            "--frontier-png",
            args.frontier_png,
            lambda: plot_frontier(points, args.frontier_png, chosen=chosen),
        )
        log(f"wrote {args.frontier_png}")
    if args.dump_plan:
        import pyarrow as pa
        import pyarrow.parquet as pq

        t = time.perf_counter()
        table = pa.table(_plan_rows(plan))
        _write("--dump-plan", args.dump_plan, lambda: pq.write_table(table, args.dump_plan))
        log(f"wrote {args.dump_plan}: {table.num_rows:,} rows in {time.perf_counter() - t:.2f}s")
    return 0


def _packed_edges(args, edges, lengths: np.ndarray) -> list[int]:
    """The edges a packed run packs within: --edges, K optimal edges, or for auto one bucket (a
    full shuffle), as pipeline.core.epochs.resolve_edges does in packed mode."""
    if edges is not None:
        return list(edges)
    k = 1 if args.num_buckets == "auto" else int(args.num_buckets)
    return optimize(lengths, k)


def _packed_report(args, lengths, ids, edges, log) -> tuple:
    """The packed epoch's plan and its summary (pipeline.core.packing.packed_summary)."""
    width = args.attention_width or attention_width_for(ModelConfig().d_model)
    try:
        batching = BatchingConfig(
            mode="packed",
            row_tokens=args.row_tokens,
            rows_per_step=args.rows_per_step,
            open_rows=args.open_rows,
            balance_rows=args.balance_rows,
            attention_width=width,
            pad_to_multiple_of=args.pad_to_multiple_of,
        )
        spec = PackingSpec(
            row_tokens=batching.row_tokens,
            rows_per_step=batching.rows_per_step,
            attention_width=width,
            open_rows=batching.open_rows,
            balance_rows=batching.balance_rows,
        )
        t = time.perf_counter()
        plan = pack_epoch(
            lengths,
            edges,
            seed=args.plan_seed,
            epoch=args.epoch,
            world_size=args.world_size,
            spec=spec,
            sample_ids=ids,
            pad_to_multiple_of=args.pad_to_multiple_of,
        )
    except ValidationError as err:
        msg = err.errors()[0]["msg"].removeprefix("Value error, ")
        raise InputError(_packed_flags(msg)) from None
    except ConfigError as err:
        raise InputError(_packed_flags(str(err))) from None
    seconds = time.perf_counter() - t
    log(f"packed epoch {args.epoch} in {seconds:.2f}s")
    summary = {**packed_summary(plan), "edges": [int(e) for e in edges], "attention_width": width}
    summary["pack_seconds"] = seconds
    return plan, summary


def _packed_flags(msg: str) -> str:
    for name in ("row_tokens", "rows_per_step", "open_rows", "balance_rows", "attention_width"):
        msg = msg.replace(f"batching.{name}", _flag(name))
    return msg.replace("batching.pad_to_multiple_of", "--pad-to-multiple-of").replace(
        "the world size", "--world-size"
    )


def _packed_text(s: dict) -> str:
    return (
        f"packed rows: {s['rows']:,} rows in {s['steps']:,} steps, edges {s['edges']}; row fill "
        f"{s['row_fill']:.3f}, {s['docs_per_row']:.2f} documents per row; rank cost max / mean "
        f"{s['rank_max_over_mean']:.3f}, useful / paid {s['useful_over_paid']:.3f} (attention "
        f"width {s['attention_width']}); plan hash {s['hash']}"
    )


def _plan_rows(plan) -> dict:
    """plan.table(), and for a packed plan each sample's row (-1: an empty micro-batch)."""
    out = plan.table()
    if plan.packed:
        row = np.full(out["sample_id"].size, -1, dtype=np.int64)
        real = out["sample_id"] >= 0
        pos = np.arange(plan.num_samples)
        row[real] = np.searchsorted(plan.rows.row_offsets, pos, side="right") - 1
        out["row"] = row
    return out


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
