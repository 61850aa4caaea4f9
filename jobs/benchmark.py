"""Benchmarks: `python -m jobs.benchmark --out BENCHMARKS.md` (what `make bench` runs).

Measures, in one run on the same data and model, padding and planning cost per batching policy,
training throughput under each policy, training-signal quality and data delivery; writes the
Markdown document, the JSON it is rendered from, and PNG plots. A trial run (--quick, a --skip-*
flag, --train-repeats or --train-samples) writes under out/bench-trial/ unless --out, --json or
--plots say otherwise, so it never replaces the tracked results; every file is written in full
beside its target and moved into place only once the run has succeeded.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from bench.plots import plot_all
from bench.render import render_headline, render_markdown
from bench.suite import GPU_METRICS, SuiteOptions, run_suite
from pipeline.core.synthetic import PRESETS

PROG = "python -m jobs.benchmark"
# (markdown, json, plots): the tracked outputs of a full run, and where a trial run writes.
TRACKED = ("BENCHMARKS.md", "benchmarks/results.json", "benchmarks")
TRIAL = ("out/bench-trial/BENCHMARKS.md", "out/bench-trial/results.json", "out/bench-trial")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--out", help=f"Markdown output (default {TRACKED[0]}; trial runs: {TRIAL[0]})")
    p.add_argument("--json", help=f"results JSON (default {TRACKED[1]}; trial runs: {TRIAL[1]})")
    p.add_argument(
        "--plots", help=f"folder for the PNGs (default {TRACKED[2]}; trial runs: {TRIAL[2]})"
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


def is_trial(args: argparse.Namespace) -> bool:
    """A run whose results are not the full measurement (smoke scale, skipped sections)."""
    return bool(
        args.quick
        or args.skip_training
        or args.skip_delivery
        or args.skip_scale
        or args.train_repeats is not None
        or args.train_samples is not None
    )


def output_paths(args: argparse.Namespace) -> tuple[str, str, str]:
    """(markdown, json, plots): the flags given, else the tracked paths, or the trial paths."""
    default = TRIAL if is_trial(args) else TRACKED
    return args.out or default[0], args.json or default[1], args.plots or default[2]


def write_atomic(path: str | Path, text: str) -> None:
    """Write beside `path`, then move into place: a failure never leaves a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _saver(path: str):
    """Progress saves during the run go to `<json>.partial`, never over the results."""

    def save(results: dict) -> None:
        write_atomic(f"{path}.partial", json.dumps(results, indent=1) + "\n")

    return save


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if (args.train_repeats or 1) < 1 or (args.train_samples or 1) < 1:
        print(f"{PROG}: error: --train-repeats and --train-samples must be >= 1", file=sys.stderr)
        return 2
    command = " ".join([PROG, *map(shlex.quote, sys.argv[1:] if argv is None else argv)])

    def log(msg: str) -> None:
        print(f"[bench] {msg}", file=sys.stderr, flush=True)

    out, js, plots = output_paths(args)
    if args.from_json:
        results = json.loads(Path(args.from_json).read_text())
    else:
        results = run_suite(options(args), command=command, log=log, save=_saver(js))
    results["plots"] = plot_all(results, plots)
    # Everything rendered first, then written: a rendering error replaces nothing.
    texts = {
        js: json.dumps(results, indent=1) + "\n",
        out: render_markdown(results, doc_path=out, json_path=js),
        # The README's headline: the same table, generated, for the README to include or copy.
        Path(plots) / "headline.md": render_headline(results, doc_path=out) + "\n",
    }
    for path, text in texts.items():
        write_atomic(path, text)
    Path(f"{js}.partial").unlink(missing_ok=True)
    headline = Path(plots) / "headline.md"
    readme = Path(args.readme) if args.readme else None
    if readme is not None and readme.is_file():
        spliced = splice_headline(readme.read_text(), headline.read_text())
        if spliced is not None:
            write_atomic(readme, spliced)
            log(f"updated the headline in {readme}")
    log(f"wrote {out}, {js}, {headline} and {len(results['plots'])} plots in {plots}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
