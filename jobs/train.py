"""Train: `python -m jobs.train --config configs/local.yaml [--set train.lr=3e-4 ...]`.

Starts a private local Ray instance, unless --address or RAY_ADDRESS names a cluster to join
(`ray job submit` sets RAY_ADDRESS; `--address auto` joins the cluster `ray start` left on this
machine). Resubmitting with the same checkpoint.run_name resumes from the latest checkpoint.
A user error (config, data, resume, storage, a non-finite loss) ends in one line on stderr and
exit code 2; --debug (or BUCKETRAY_DEBUG=1) adds the traceback. Ctrl-C or SIGTERM while the run
is being prepared ends it with one closing line and exit code 130; during training the first
one stops it gracefully with a checkpoint, a second aborts it (closing line, exit code 130).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from jobs._cli import add_overrides
from pipeline.core.config import ConfigError, load_config

DEBUG_ENV = "BUCKETRAY_DEBUG"


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    if isinstance(e, OSError) and not isinstance(e, ConfigError):
        return f"{type(e).__name__}: {text} (check the path and its permissions; --debug for more)"
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.train", description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/local.yaml", help="YAML run config")
    add_overrides(ap, "override a config field, e.g. --set train.max_steps=50 (repeatable)")
    ap.add_argument(
        "--address",
        default=None,
        help="Ray cluster to join: host:port, ray://host:port, or auto (the one `ray start` "
        "left on this machine); default: RAY_ADDRESS if set, else a private local Ray",
    )
    ap.add_argument(
        "--debug", action="store_true", help=f"print tracebacks of user errors ({DEBUG_ENV}=1)"
    )
    args = ap.parse_args(argv)
    debug = args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    # Imported after validation, so a config typo fails before Ray or torch load.
    from pipeline.train.control import deterministic_cause
    from pipeline.train.launch import run
    from pipeline.train.runlock import ABORT_EXIT, interrupted_line

    try:
        summary = run(cfg, address=args.address, debug=debug)
    except KeyboardInterrupt as e:  # Ctrl-C (or SIGTERM) while the run was being prepared
        if debug:
            traceback.print_exc()
        print(interrupted_line(str(e) or "SIGINT", training=False), file=sys.stderr, flush=True)
        return ABORT_EXIT
    except Exception as e:
        # A user error: a config, data, resume or checkpoint error, a non-finite loss (any class
        # with `retryable = False`), or storage that cannot be reached or written (OSError),
        # named by the error itself, not by the Ray task or actor that carried it.
        cause = deterministic_cause(e) or (e if isinstance(e, OSError) else None)
        if cause is None:
            raise
        if debug:
            traceback.print_exc()
        print(f"error: {_one_line(cause)}", file=sys.stderr)
        return 2
    print(f"[bucketray] done: {summary}", flush=True)
    if summary.picture:
        print(f"[bucketray] picture of the run: {summary.picture}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
