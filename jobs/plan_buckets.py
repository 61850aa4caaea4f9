"""Bucket report CLI: edges, per-bucket sizes and simulated padding efficiency for a set of lengths.

    python -m jobs.plan_buckets --preset seed902k --num-buckets auto --batch-size 32 \\
        --json out/report.json --png out/report.png --dump-plan out/plan.parquet

Lengths come from the seed-calibrated preset, a 1-D integer .npy (sample id = position) or a
parquet dataset (through the Ray Data length index). The flags, on top of `--config` and with
`--set` last, make a run config (each flag sets the config field its help names), validated as
`jobs.train` validates it; the report is then the library's: the edges the run would resolve
(`pipeline.core.epochs.resolve_edges`), their epoch plan and the policy table
(`pipeline.report`); with batching.mode=packed (`--row-tokens`, or the config's), also the
packed epoch the run would train. The table goes to stdout, progress and timings to stderr; a
bad input or config is one line on stderr naming the fix, with exit code 2. No model is needed:
token ids of `--data` are checked against a vocabulary only when `--config` or `--vocab-size`
gives one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from jobs._cli import add_overrides, count
from jobs._plan_inputs import InputError, check_lengths, check_top_edge, load_lengths
from pipeline.core.config import (
    DEFAULT_TOKEN_BUDGET,
    ConfigError,
    PackedBatching,
    RunConfig,
    load_config,
    validate,
)
from pipeline.core.frontier import FrontierPoint, frontier_ks
from pipeline.core.metrics import truncation_counts
from pipeline.core.synthetic import PRESETS
from pipeline.report.build import MAX_BUCKETS, build_report, packed_report
from pipeline.report.plot import plot_frontier, plot_report
from pipeline.report.text import packed_line, render_text

PROG = "python -m jobs.plan_buckets"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not the usage block
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _num_buckets(s: str) -> int | str:
    if s == "auto":
        return s
    try:
        k = int(s)
    except ValueError:
        k = 0
    if k < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 or 'auto', got {s!r}")
    return k


# Flag -> the run config field it sets (None: the flag was not given, the config's value holds).
FIELDS = {
    "num_buckets": "buckets.num_buckets",
    "max_buckets": "buckets.max_buckets",
    "target_efficiency": "buckets.target_efficiency",
    "max_recomposition_floor": "buckets.max_recomposition_floor",
    "pad_to_multiple_of": "batching.pad_to_multiple_of",
    "world_size": "scaling.num_workers",
    "plan_seed": "plan.seed",
    "max_length": "data.max_length",
    "over_length": "data.over_length",
}
PADDED = {"fill": "batching.fill", "round_to": "batching.round_to"}
PACKED = {
    "row_tokens": "batching.row_tokens",
    "rows_per_step": "batching.rows_per_step",
    "open_rows": "batching.open_rows",
    "balance_rows": "batching.balance_rows",
    "attention_width": "batching.attention_width",
}


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
        help="the run config the flags apply to (for --data also its vocabulary, longest sample "
        "and bad rows); default: the config defaults on 1 worker, no vocabulary check",
    )
    add_overrides(p, "set a run config field, after the flags (repeatable)")
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
    e.add_argument("--num-buckets", type=_num_buckets, help="buckets.num_buckets: K or 'auto'")
    e.add_argument("--edges", help="buckets.edges, e.g. 0,770,1216,1728,2432,3296,8192")
    p.add_argument("--max-buckets", type=count(1), help="buckets.max_buckets (auto's bound on K)")
    p.add_argument("--target-efficiency", type=float, help="buckets.target_efficiency (auto)")
    p.add_argument(
        "--max-recomposition-floor",
        type=float,
        help="buckets.max_recomposition_floor: auto caps K where the recomposition floor exceeds it",
    )
    b = p.add_mutually_exclusive_group()
    b.add_argument("--batch-size", type=count(1), help="batching.mode=fixed, batching.batch_size")
    b.add_argument(
        "--token-budget",
        type=count(1),
        help=f"batching.token_budget: padded tokens per global step (default {DEFAULT_TOKEN_BUDGET}; "
        "with a packed config, a packed step's tokens)",
    )
    p.add_argument(
        "--fill", choices=["greedy", "fixed_per_bucket"], help="batching.fill (token budget)"
    )
    p.add_argument("--round-to", type=count(0), help="batching.round_to (token budget)")
    p.add_argument("--pad-to-multiple-of", type=count(1), help="batching.pad_to_multiple_of")
    p.add_argument("--world-size", type=count(1), help="scaling.num_workers: ranks (default 1)")
    _add_packed_args(p)
    _add_plan_args(p)
    return p


def _add_packed_args(p: argparse.ArgumentParser) -> None:
    """batching.mode=packed: with --row-tokens, the report adds the packed epoch (and
    --dump-plan writes it); the padded report beside it keeps the padded batching flags."""
    g = p.add_argument_group("packed rows (batching.mode=packed)")
    g.add_argument(
        "--row-tokens", type=count(1), help="report the packed epoch too: batching.row_tokens"
    )
    g.add_argument("--rows-per-step", type=count(1), help="batching.rows_per_step")
    g.add_argument("--open-rows", type=count(1), help="batching.open_rows")
    g.add_argument("--balance-rows", type=count(1), help="batching.balance_rows")
    g.add_argument("--attention-width", type=count(1), help="batching.attention_width")


def _add_plan_args(p: argparse.ArgumentParser) -> None:
    """Over-length handling, seeds, epoch and the output files."""
    p.add_argument(
        "--over-length",
        choices=("error", "truncate"),
        help="data.over_length: lengths above the top edge stop the report, or are cut and counted",
    )
    p.add_argument(
        "--max-length",
        type=count(1),
        help="data.max_length, the top edge bound without --edges (default: the config's; for "
        "--data without --config the longest sample)",
    )
    p.add_argument(
        "--plan-seed", type=count(0), help="plan.seed (also the random/megabatch policies)"
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


def _sets(args, fields: dict[str, str]) -> list[str]:
    return [
        f"{key}={getattr(args, f)}" for f, key in fields.items() if getattr(args, f) is not None
    ]


def _default_max_length(args) -> str | None:
    """data.max_length when nothing sets it: without a run config, the top edge bound is what
    the lengths need: the given edges' top, or for --data the longest sample ("data": known once
    the lengths are loaded); None: data.max_length's default."""
    given = args.max_length is not None or any(
        o.startswith("data.max_length=") for o in args.overrides
    )
    if given or args.config is not None:
        return None
    if args.edges is not None:
        return args.edges.strip("[]").split(",")[-1].strip()
    return "data" if args.data else None


def _common(args, lengths: np.ndarray | None) -> list[str]:
    """Overrides of the flags every view of the run shares: source, buckets, scaling, plan."""
    out = []
    if args.preset:
        out += [
            f"data.synthetic.preset={args.preset}",
            f"data.synthetic.num_samples={args.num_samples}",
            f"data.synthetic.seed={args.corpus_seed}",
        ]
    else:  # a .npy of lengths or a parquet dataset: where the lengths came from
        out.append(f"data.path={args.lengths_npy or args.data}")
    if args.config is None:
        out.append("scaling.num_workers=1")  # the report's own default: one rank
    top = _default_max_length(args)
    if top is not None:
        out.append(f"data.max_length={int(lengths.max()) if top == 'data' else top}")
    if args.edges is not None:
        out.append(f"buckets.edges=[{args.edges.strip('[]')}]")
    return out + _sets(args, FIELDS)


def _padded(args) -> list[str]:
    if args.batch_size is not None:  # with --fill or --round-to: refused by the config
        out = ["batching.mode=fixed", f"batching.batch_size={args.batch_size}"]
    elif args.token_budget is not None:
        out = ["batching.mode=token_budget", f"batching.token_budget={args.token_budget}"]
    else:
        out = []
    return out + _sets(args, PADDED)


def run_configs(args, lengths: np.ndarray | None) -> tuple[RunConfig, RunConfig | None]:
    """(the padded run config the report scores, the packed one whose epoch it adds or None):
    the flags on `--config`, `--set` last, validated by the config module."""
    common = _common(args, lengths)

    def load(flags: list[str]) -> RunConfig:
        return load_config(args.config, common + flags + args.overrides)

    padded = load(_padded(args))
    packed = load(["batching.mode=packed", *_sets(args, PACKED)]) if args.row_tokens else None
    if isinstance(padded.batching, PackedBatching):  # the config or --set asks for packed rows
        packed = packed or padded
        batching = {"pad_to_multiple_of": padded.batching.pad_to_multiple_of}
        if args.batch_size is not None:
            batching |= {"mode": "fixed", "batch_size": args.batch_size}
        else:  # by default the padded batches hold a packed step's tokens
            step = padded.batching.step_tokens
            batching |= {"mode": "token_budget", "token_budget": args.token_budget or step}
        batching |= {k: getattr(args, k) for k in PADDED}  # with --batch-size: refused
        batching = {k: v for k, v in batching.items() if v is not None}
        padded = validate(padded.model_dump() | {"batching": batching})
    return padded, packed


def run(args) -> int:
    def log(msg: str) -> None:
        print(f"[plan_buckets] {msg}", file=sys.stderr, flush=True)

    t = time.perf_counter()
    if args.data:
        log(f"building the length index of {args.data} with Ray Data (cached for the next run)")
    configs = None if _default_max_length(args) == "data" else run_configs(args, None)
    lengths, ids, source = load_lengths(args)
    log(f"loaded {source}: {lengths.size:,} lengths in {time.perf_counter() - t:.2f}s")
    check_lengths(lengths, ids, source)
    cfg, packed_cfg = configs or run_configs(args, lengths)
    top, _ = cfg.top_edge_bound()
    truncation = None
    if cfg.data.over_length == "truncate":
        truncation = {"top": top, **truncation_counts(lengths, top)}
        lengths = np.minimum(lengths, top)
    else:
        check_top_edge(top, lengths, ids, "--edges" if cfg.buckets.edges else "--max-length")

    report, plan = build_report(
        lengths,
        cfg,
        epoch=args.epoch,
        sample_ids=ids,
        frontier_ks=frontier_ks(getattr(cfg.buckets, "max_buckets", MAX_BUCKETS))
        if args.frontier_png
        else (),
        log=log,
    )
    report["source"] = source
    if truncation is not None:
        report["truncation"] = truncation
    print(f"source: {source}")
    print(render_text(report))
    if packed_cfg is not None:
        report["packed"], plan = packed_report(
            lengths, packed_cfg, epoch=args.epoch, sample_ids=ids, log=log
        )
        print(packed_line(report["packed"]))
    _write_outputs(args, report, lengths, plan, log)
    return 0


def _write_outputs(args, report: dict, lengths: np.ndarray, plan, log) -> None:
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
