"""Benchmarks: `python -m jobs.benchmark --out BENCHMARKS.md` (what `make bench` runs).

Measures, in one run on the same data and model, padding and planning cost per batching policy,
training throughput under each policy, training-signal quality and data delivery; writes the
Markdown document, the JSON it is rendered from, and PNG plots.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from pipeline.bench.plots import plot_all
from pipeline.bench.render import render_headline, render_markdown
from pipeline.bench.suite import GPU_METRICS, SuiteOptions, run_suite
from pipeline.core.synthetic import PRESETS

PROG = "python -m jobs.benchmark"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--out", default="BENCHMARKS.md", help="Markdown output (default %(default)s)")
    p.add_argument(
        "--json", default="benchmarks/results.json", help="results JSON (default %(default)s)"
    )
    p.add_argument(
        "--plots", default="benchmarks", help="folder for the PNGs (default %(default)s)"
    )
    p.add_argument(
        "--quick", action="store_true", help="smoke run of every section at small scale (~3 min)"
    )
    p.add_argument(
        "--full",
        action="store_true",
        help=f"also measure delivery on the full {PRESETS['seed902k']:,}-sample corpus (~1 GB)",
    )
    p.add_argument(
        "--readme",
        default=None,
        help="also replace the headline block (between the bench:headline markers) of this file, "
        "e.g. README.md (`make bench` does); off by default, so trial runs leave it alone",
    )
    p.add_argument("--skip-training", action="store_true", help="skip section 2 (Ray Train runs)")
    p.add_argument("--skip-delivery", action="store_true", help="skip section 4 (Ray Data)")
    p.add_argument(
        "--skip-scale", action="store_true", help="skip timing the planner at 10x the samples"
    )
    p.add_argument("--train-repeats", type=int, help="training rounds (default 3; --quick: 1)")
    p.add_argument("--train-samples", type=int, help="training samples (default 3000)")
    p.add_argument(
        "--work-dir", default="out/bench", help="runs, metrics and corpora (default %(default)s)"
    )
    p.add_argument(
        "--from-json",
        metavar="PATH",
        help="measure nothing: re-render the document and plots from an earlier results JSON",
    )
    p.add_argument(
        "--gpu-metrics",
        default=GPU_METRICS,
        help="metrics file of a scripts/gpu_smoke.sh run, for the GPU row (default %(default)s)",
    )
    return p


def options(args: argparse.Namespace) -> SuiteOptions:
    kw: dict = {
        "training": not args.skip_training,
        "delivery": not args.skip_delivery,
        "work_dir": args.work_dir,
        "gpu_metrics": args.gpu_metrics,
    }
    if args.skip_scale:
        kw["scale_factor"] = 1
    if args.train_repeats is not None:
        kw["train_repeats"] = args.train_repeats
    if args.train_samples is not None:
        kw["train_samples"] = args.train_samples
    opts = SuiteOptions.quick_variant(**kw) if args.quick else SuiteOptions(**kw)
    if args.full:
        opts.delivery_samples = [*opts.delivery_samples, PRESETS["seed902k"]]
    return opts


HEADLINE_START = "<!-- bench:headline:start (written by make bench) -->"
HEADLINE_END = "<!-- bench:headline:end -->"


def splice_headline(text: str, headline: str) -> str | None:
    """`text` with the block between the headline markers replaced, or None without markers."""
    a, b = text.find(HEADLINE_START), text.find(HEADLINE_END)
    if a < 0 or b < a:
        return None
    return text[: a + len(HEADLINE_START)] + "\n" + headline.strip() + "\n" + text[b:]


def _saver(path: str):
    def save(results: dict) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(results, indent=1) + "\n")

    return save


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if (args.train_repeats or 1) < 1 or (args.train_samples or 1) < 1:
        print(f"{PROG}: error: --train-repeats and --train-samples must be >= 1", file=sys.stderr)
        return 2
    command = " ".join([PROG, *map(shlex.quote, sys.argv[1:] if argv is None else argv)])

    def log(msg: str) -> None:
        print(f"[bench] {msg}", file=sys.stderr, flush=True)

    if args.from_json:
        results = json.loads(Path(args.from_json).read_text())
    else:
        results = run_suite(options(args), command=command, log=log, save=_saver(args.json))
    results["plots"] = plot_all(results, args.plots)
    for path in (args.out, args.json):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    Path(args.out).write_text(render_markdown(results, doc_path=args.out, json_path=args.json))
    # The README's headline: the same table, generated, for the README to include or copy.
    headline = Path(args.plots) / "headline.md"
    headline.write_text(render_headline(results, doc_path=args.out) + "\n")
    readme = Path(args.readme) if args.readme else None
    if readme is not None and readme.is_file():
        spliced = splice_headline(readme.read_text(), headline.read_text())
        if spliced is not None:
            readme.write_text(spliced)
            log(f"updated the headline in {readme}")
    log(
        f"wrote {args.out}, {args.json}, {headline} and {len(results['plots'])} plots in "
        f"{args.plots}/"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
