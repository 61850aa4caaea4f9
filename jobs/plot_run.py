"""Draw a run's picture: `python -m jobs.plot_run RUN_DIR [--out PNG]`.

RUN_DIR is `<checkpoint.storage_path>/<checkpoint.run_name>`, local or a URI (s3://...). The
picture is drawn from the step history in the run's latest checkpoint: raw against debiased
loss, each bucket's loss, the learning rate, padding efficiency and real tokens per second.
Default output: `RUN_DIR/run.png` for a local run, `./<run name>-run.png` for a remote one.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m jobs.plot_run", description=__doc__.splitlines()[0]
    )
    ap.add_argument("run_dir", help="the run's directory: <storage_path>/<run_name>")
    ap.add_argument("--out", default=None, help="where to write the PNG")
    args = ap.parse_args(argv)
    from pipeline.train.run_picture import draw_run

    try:
        path = draw_run(args.run_dir, args.out)
    except (FileNotFoundError, ValueError, OSError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
