"""Inline or asynchronous held-out evaluation: what each costs on the demo, measured.

`eval.mode=inline` pauses every rank while it evaluates its share of the held-out set;
`eval.mode=async` writes a checkpoint at each evaluation and lets Ray Train's ValidationConfig
evaluate it in a task of its own (one worker's resources, one process) while training goes on.
This runs the demo (`configs/local.yaml`: 2 CPU workers, an evaluation every 25 steps and at the
start and end) once per mode per round, the modes alternating, and reports per run: the wall
time of the whole run, the seconds of training steps, the checkpoints written, each evaluation's
own seconds (inline: the pause; async: the task's, and its latency from the checkpoint's report
to its record), and whether every evaluation of the schedule arrived before the run ended.

    python -m bench.eval_modes --out benchmarks/eval_modes.json [--rounds 2]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import time
from pathlib import Path

import numpy as np

from bench.common import DEMO_CONFIG
from pipeline.core.config import load_config

__all__ = ["measure_mode", "main"]


def measure_mode(work: Path, mode: str, tag: str) -> dict:
    """One demo run with `eval.mode=mode`; what it cost."""
    from pipeline.data.fs import filesystem_for
    from pipeline.train.evaluate_run import read_async_evals
    from pipeline.train.history import EvalHistory, StepHistory
    from pipeline.train.launch import run

    name = f"evalmode-{mode}-{tag}"
    metrics_file = work / "metrics" / f"{name}.jsonl"
    metrics_file.parent.mkdir(parents=True, exist_ok=True)
    metrics_file.unlink(missing_ok=True)
    cfg = load_config(
        DEMO_CONFIG,
        [
            f"data.synthetic.out_dir={work / 'corpus'}",
            f"checkpoint.storage_path={work / 'runs'}",
            f"checkpoint.run_name={name}",
            "wandb.mode=disabled",
            f"train.metrics_file={metrics_file}",
            f"eval.mode={mode}",
        ],
    )
    t0 = time.perf_counter()
    summary = run(cfg)
    wall = time.perf_counter() - t0
    ckpt_dir = Path(summary.checkpoint)
    steps = StepHistory.read_dir(str(ckpt_dir)).arrays()
    lines = [json.loads(x) for x in metrics_file.read_text().splitlines() if x.strip()]
    saves = [m["checkpoint/save_s"] for m in lines if "checkpoint/save_s" in m]
    if mode == "inline":
        ev = EvalHistory.read_dir(str(ckpt_dir)).arrays()
        latency = ev["seconds"]
    else:
        fs, root = filesystem_for(str(ckpt_dir.parent))
        ev = read_async_evals(fs, root, 8).arrays()
        recs = [
            json.loads(p.read_text()) for p in sorted((ckpt_dir.parent / "evals").glob("*.json"))
        ]
        latency = np.array([r["eval/latency_s"] for r in recs])
    return {
        "mode": mode,
        "wall_s": wall,
        "step_s": float(np.sum(steps["seconds"])),
        "steps": int(summary.steps),
        "checkpoints": len(saves),
        "checkpoint_save_s": float(np.sum(saves)),
        "evaluations": ev["step"].astype(int).tolist(),
        "eval_s": ev["seconds"].tolist(),
        "eval_latency_s": [float(x) for x in latency],
        "final_eval_loss": float(ev["loss"][-1]) if len(ev["loss"]) else None,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/eval_modes.json")
    ap.add_argument("--work", default="out/eval_modes")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    work = Path(args.work).absolute()
    out: dict = {
        "command": "python -m bench.eval_modes " + " ".join(argv or []),
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()} CPU cores",
        "runs": [],
    }
    for r in range(args.rounds):
        modes = ("inline", "async") if r % 2 == 0 else ("async", "inline")
        for mode in modes:
            res = measure_mode(work, mode, f"r{r}")
            out["runs"].append(res)
            print(
                f"eval_modes: round {r} {mode}: {res['wall_s']:.0f} s wall, "
                f"{res['step_s']:.0f} s of steps, {len(res['evaluations'])} evaluations, "
                f"{res['checkpoints']} checkpoints",
                flush=True,
            )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
