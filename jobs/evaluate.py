"""Evaluate a checkpoint on held-out data: `python -m jobs.evaluate RUN_DIR [--set ...] [--json OUT]`.

RUN_DIR is `<checkpoint.storage_path>/<checkpoint.run_name>` (local or s3://...); its latest
complete checkpoint is evaluated, or `--checkpoint checkpoint_step00000120`. The run's own config
(saved in each checkpoint) names the model and the held-out set; `--set eval.path=DIR` or
`--set eval.split=NAME` names another, `--set scaling.num_workers=N` evaluates on N workers (the
figures do not depend on it). Prints the held-out loss, accuracy, per-sample loss and each
training bucket's loss, the same figures a run logs as `eval/*`; `--json OUT` writes them under
those names with the checkpoint and its step. A user error ends in one line and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jobs._cli import add_overrides


def _lines(m: dict, target) -> list[str]:
    p = target.position
    out = [
        f"[bucketray] {target.uri} (step {p.steps_done}, epoch {p.epoch}):",
        f"  eval/loss            {m['eval/loss']:.4f}",
        f"  eval/loss_per_sample {m['eval/loss_per_sample']:.4f}",
        f"  eval/accuracy        {m['eval/accuracy']:.4f}",
        f"  held-out samples {int(m['eval/samples']):,}, supervised tokens "
        f"{int(m['eval/tokens']):,}, {m['eval/seconds']:.1f} s",
    ]
    edges = target.edges
    for k in range(len(edges) - 1):
        v = m.get(f"eval/loss_by_bucket/{k}")
        if v is not None:
            out.append(
                f"  eval/loss_by_bucket/{k:<3} {v:.4f}  (lengths {edges[k] + 1}-{edges[k + 1]})"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m jobs.evaluate", description=__doc__.splitlines()[0]
    )
    ap.add_argument("run_dir", help="the run's directory: <storage_path>/<run_name>")
    ap.add_argument("--checkpoint", default=None, help="a checkpoint's name (default: the latest)")
    add_overrides(ap, "override a field of the run's config, e.g. --set eval.path=DIR")
    ap.add_argument("--json", default=None, help="write the figures to this JSON file")
    ap.add_argument("--address", default=None, help="Ray cluster to join (as jobs.train)")
    ap.add_argument("--debug", action="store_true", help="print Ray's output and tracebacks")
    args = ap.parse_args(argv)

    from pipeline.train.control import deterministic_cause
    from pipeline.train.evaluate_run import evaluate_checkpoint, find_checkpoint, target_config
    from pipeline.train.launch import init_ray

    try:
        target = find_checkpoint(args.run_dir, args.checkpoint)
        cfg = target_config(target, args.overrides)
        init_ray(args.address, debug=args.debug)
        metrics = evaluate_checkpoint(cfg, target)
    except Exception as e:
        cause = deterministic_cause(e) or (e if isinstance(e, OSError) else None)
        if cause is None:
            raise
        if args.debug:
            import traceback

            traceback.print_exc()
        print(f"error: {' '.join(str(cause).split())}", file=sys.stderr)
        return 2
    print("\n".join(_lines(metrics, target)), flush=True)
    if args.json:
        record = {
            "checkpoint": target.uri,
            "step": target.position.steps_done,
            "epoch": target.position.epoch,
            **{k: v for k, v in metrics.items() if k.startswith("eval/")},
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(record, indent=1))
        print(f"[bucketray] wrote {args.json}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
