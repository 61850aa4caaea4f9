"""Train: `python -m jobs.train --config configs/local.yaml [--set train.lr=3e-4 ...]`.

Locally it starts Ray on this machine; under `ray job submit` (or with RAY_ADDRESS set) it joins
that cluster. Resubmitting with the same checkpoint.run_name resumes from the latest checkpoint.
"""

from __future__ import annotations

import argparse
import sys

from pipeline.core.config import ConfigError, load_config


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.train", description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/local.yaml", help="YAML run config")
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. --set train.max_steps=50 (repeatable)",
    )
    args = ap.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        # Imported after validation, so a config typo fails before Ray or torch load.
        from pipeline.data import DataError
        from pipeline.train.launch import run

        try:
            summary = run(cfg)
        except (DataError, FileNotFoundError) as e:  # names the file and sample id
            raise ConfigError(str(e)) from None
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"[bucketray] done: {summary}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
