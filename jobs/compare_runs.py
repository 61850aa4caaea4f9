"""Compare runs: `python -m jobs.compare_runs RUN_DIR [RUN_DIR ...] [--out PNG] [--json OUT]`.

The first run is measured against each of the others, from their run directories alone (local
or s3://): held-out loss at equal real tokens and at equal training time, when it reached each
other run's final held-out loss, each document length range's held-out difference at the last
common token count (where both runs split it by the same ranges), and each run's training-loss
jumpiness taken apart. One verdict line per comparison on stdout (and one by length); `--out`
draws the picture, `--json` writes every figure.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m jobs.compare_runs", description=__doc__.splitlines()[0]
    )
    ap.add_argument("run_dirs", nargs="+", help="run directories; the first is measured")
    ap.add_argument("--out", default=None, help="where to draw the comparison's PNG")
    ap.add_argument("--json", default=None, help="where to write the figures as JSON")
    args = ap.parse_args(argv)
    if len(args.run_dirs) < 2:
        print("error: name at least two run directories (the first is measured)", file=sys.stderr)
        return 2
    from pipeline.core.jumpiness import Jumpiness
    from pipeline.train.compare_runs import (
        RunCurves,
        by_length_line,
        compare,
        jumpiness_of,
        verdict_line,
    )
    from pipeline.train.run_record import read_run

    try:
        runs = [RunCurves(read_run(d)) for d in args.run_dirs]
    except (FileNotFoundError, ValueError, OSError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    comparisons = [compare(runs[0], ref) for ref in runs[1:]]
    for c in comparisons:
        print(verdict_line(c))
        line = by_length_line(c)
        if line:
            print(line)
        for w in c["warnings"]:
            print(f"warning: {w}")
    jumpiness = {r.name: jumpiness_of(r) for r in runs}
    for r in runs:
        print(
            f"{r.name}: "
            + " ".join(" ".join(Jumpiness.from_dict(jumpiness[r.name]).lines()).split())
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"comparisons": comparisons, "jumpiness": jumpiness}, f, indent=2)
    if args.out:
        from pipeline.train.compare_picture import draw_comparison

        print(draw_comparison(runs, comparisons, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
