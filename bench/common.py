"""What every benchmark script shares: its command line, the record of where and when it ran
(`meta`: command, date, machine, load average, duration) and its JSON, written whole or not at
all. A `--quick` run (smoke scale) writes under out/bench-trial/ unless `--out` says otherwise,
so it never replaces a tracked result.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "DEMO_CONFIG",
    "config_step_tokens",
    "loadavg",
    "machine_info",
    "median_time",
    "run_script",
    "torch_threads",
    "write_json",
]

TRIAL_DIR = "out/bench-trial"
DEMO_CONFIG = "configs/local.yaml"  # the demo's config: the model and budget benchmarks share


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def loadavg() -> list[float]:
    """The 1, 5 and 15-minute load averages: the machine is shared, so they go with every figure."""
    parts = _read("/proc/loadavg").split()
    return [float(x) for x in parts[:3]]


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_info() -> dict:
    """CPU model, cores, RAM, GPU, library versions and the git commit the figures belong to."""
    import numpy as np
    import pyarrow
    import torch

    try:
        import ray

        ray_version = ray.__version__
    except ImportError:  # the pure benchmarks run without Ray
        ray_version = None
    lines = _read("/proc/cpuinfo").splitlines()
    cpu = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "")
    mem = next((ln.split()[1] for ln in _read("/proc/meminfo").splitlines() if "MemTotal" in ln), 0)
    return {
        "cpu": cpu or platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "ram_gib": round(int(mem) / 2**20, 1),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray": ray_version,
        "numpy": np.__version__,
        "pyarrow": pyarrow.__version__,
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }


def median_time(fn: Callable, repeats: int) -> tuple[float, list[float], object]:
    """(median seconds, every run's seconds, the last result) of `repeats` calls of `fn`."""
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return float(statistics.median(times)), times, out


@contextmanager
def torch_threads(n: int):
    """torch on `n` threads inside the block (as a Ray worker with `n` CPUs), restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def write_json(path: str | Path, results: dict) -> None:
    """Write beside `path`, then move into place: a failure never leaves a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(results, indent=1) + "\n")
    os.replace(tmp, path)


def run_script(
    module: str,
    doc: str,
    measure: Callable[[argparse.Namespace, Callable[[str], None]], dict],
    add_args: Callable[[argparse.ArgumentParser], None] = lambda _: None,
    argv: list[str] | None = None,
) -> dict:
    """`python -m <module> --out benchmarks/<name>.json [--quick] ...`: parse the flags, run
    `measure(args, log)` and write its results with their `meta`. `args.plots` is the folder
    the script draws its PNGs in (the JSON's)."""
    name = module.rsplit(".", 1)[-1]
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.splitlines()[0])
    p.add_argument("--out", help=f"results JSON (default benchmarks/{name}.json)")
    p.add_argument("--quick", action="store_true", help="smoke scale, written under out/")
    add_args(p)
    args = p.parse_args(argv)
    args.out = args.out or (f"{TRIAL_DIR}/{name}.json" if args.quick else f"benchmarks/{name}.json")
    args.plots = str(Path(args.out).parent)
    Path(args.plots).mkdir(parents=True, exist_ok=True)
    argv = sys.argv[1:] if argv is None else argv

    def log(msg: str) -> None:
        print(f"[{name}] {msg}", file=sys.stderr, flush=True)

    meta = {
        "command": shlex.join(["python", "-m", module, *argv]),
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_info(),
        "load_before": loadavg(),
    }
    t = time.perf_counter()
    results = measure(args, log)
    meta |= {"load_after": loadavg(), "duration_s": time.perf_counter() - t}
    out = {"meta": meta, **results}
    write_json(args.out, out)
    log(f"wrote {args.out}")
    return out


def config_step_tokens(config: str) -> int:
    """Tokens per global step of a config's batching: a packed step's rows, or its token budget."""
    from pipeline.core.config import load_config

    return load_config(config).batching.step_tokens
