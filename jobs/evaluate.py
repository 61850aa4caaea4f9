"""Evaluate a checkpoint on held-out data: `python -m jobs.evaluate RUN_DIR [--set ...] [--json OUT]`.

RUN_DIR is `<checkpoint.storage_path>/<checkpoint.run_name>` (local or s3://...); its latest
complete checkpoint is evaluated, or `--checkpoint checkpoint_step00000120`. The run's own config
(saved in each checkpoint) names the model and the held-out set; `--set eval.path=DIR` or
`--set eval.split=NAME` names another, `--set scaling.num_workers=N` evaluates on N workers (the
figures do not depend on it). Prints the held-out loss, accuracy, per-sample loss, each
training bucket's loss and, for a run with one bucket, each length range's (the ranges its
training loss was reported by, from its step history), the same figures a run logs as
`eval/*`; `--json OUT` writes them under those names with the checkpoint and its step. A user
error ends in one line and exit code 2, a model that does not fit the checkpoint (`--set
model.*`) before any worker starts. The run's relative local paths are found from any
directory: a run records them absolute, and an older checkpoint's resolve against the
directory its relative checkpoint.storage_path was in.
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
    for k, v in m.items():  # one bucket: the run's length ranges, in their order
        if k.startswith("eval/loss_by_length/"):
            out.append(f"  {k:<28} {v:.4f}")
    return out


def _run_cwd(recorded, uri: str) -> str | None:
    """The directory an older run started in, from where its checkpoint lies: a relative
    checkpoint.storage_path `runs` and a checkpoint at `/p/runs/<run_name>/checkpoint_x` say
    `/p`. None when the storage path was absolute or remote (nothing to go by)."""
    import os

    from pipeline.train.preflight import is_relative_local

    storage = recorded.checkpoint.storage_path
    if "://" in uri or not is_relative_local(storage):
        return None
    run_dir = os.path.dirname(uri.rstrip("/"))
    tail = os.path.join(os.path.normpath(storage), recorded.checkpoint.run_name)
    if tail.startswith("..") or not run_dir.endswith(os.sep + tail):
        return None
    return run_dir[: -len(tail) - 1] or os.sep


def _overridden(key: str, overrides: list[str]) -> bool:
    keys = [o.split("=", 1)[0].strip() for o in overrides]
    return any(k == key or key.startswith(k + ".") or k.startswith(key + ".") for k in keys)


def checkpoint_config(target, overrides: list[str]):
    """The checkpoint's recorded config with `overrides` on top, its relative local paths (an
    older run's) resolved against the directory that run started in; the paths in
    `overrides` are the user's, relative to today's directory."""
    from pipeline.core.config import path_fields, validate
    from pipeline.core.deliveryconfig import upgrade_recorded
    from pipeline.data.fs import filesystem_for
    from pipeline.learn.checkpoint import RUN_CONFIG_FILE
    from pipeline.train.evaluate_run import target_config
    from pipeline.train.preflight import absolute_paths

    fs, path = filesystem_for(target.uri)
    try:
        with fs.open_input_stream(f"{path}/{RUN_CONFIG_FILE}") as f:
            recorded = validate(upgrade_recorded(json.loads(f.read())))
    except FileNotFoundError:
        return target_config(target, overrides)  # which names what is missing
    cwd = _run_cwd(recorded, target.uri)
    if cwd is None:
        return target_config(target, overrides)
    fixed = absolute_paths(recorded.model_dump(mode="json"), recorded, cwd)
    resolved = []
    for key, value in path_fields(recorded):
        node = fixed
        for part in key.split("."):
            node = node[part]
        if node != value and not _overridden(key, overrides):
            resolved.append(f"{key}={node}")
    return target_config(target, resolved + list(overrides))


def check_model_fits(cfg, target) -> None:
    """Refuse, on the driver, a model other than the one the checkpoint's weights were trained
    as (a `--set model.*` override): every worker would fail loading them."""
    from pipeline.core.config import ConfigError
    from pipeline.data.fs import filesystem_for
    from pipeline.learn.checkpoint import STATE_FILE
    from pipeline.learn.model_record import model_changes, model_record

    fs, path = filesystem_for(target.uri)
    with fs.open_input_stream(f"{path}/{STATE_FILE}") as f:
        recorded = json.loads(f.read()).get("model")
    changed = model_changes(recorded, model_record(cfg.model)) if recorded else ""
    if changed:
        raise ConfigError(
            f"the checkpoint {target.uri} was trained as another model ({changed}): drop the "
            "--set model.* overrides (the checkpoint's own config names its model)"
        )


def _check_run_dir(run_dir: str) -> None:
    """A run directory that is not there is named as such (not "no complete checkpoint"), with
    what the argument is."""
    import pyarrow.fs as pafs

    from pipeline.data.fs import filesystem_for
    from pipeline.train.evaluate_run import CheckpointError

    fs, root = filesystem_for(run_dir)
    if fs.get_file_info(root).type == pafs.FileType.NotFound:
        raise CheckpointError(
            f"run directory {run_dir} does not exist: give a run's directory, "
            "<checkpoint.storage_path>/<checkpoint.run_name> (e.g. runs/bucketray-local)"
        )


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
    from pipeline.train.evaluate_run import evaluate_checkpoint, find_checkpoint
    from pipeline.train.launch import init_ray

    try:
        _check_run_dir(args.run_dir)
        target = find_checkpoint(args.run_dir, args.checkpoint)
        cfg = checkpoint_config(target, args.overrides)
        check_model_fits(cfg, target)
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
