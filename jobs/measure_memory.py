"""Peak memory of a short training run: `python -m jobs.measure_memory [--set KEY=VALUE ...]`.

Runs configs/local_full.yaml on the 100K-sample preset (train.max_steps=20, W&B disabled) on a local
Ray instance of its own and prints the peak resident set size (VmHWM) of the driver, of each
training worker and of the feeder actor, sampled from /proc every 0.2 s. The driver holds the
length index (a few numbers per sample), never token data: tokens go from the shards through
Ray Data to the object store and the workers.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

from jobs._cli import add_overrides

PRESET = [
    "data.synthetic.num_samples=100000",
    "data.synthetic.out_dir=data/synthetic-100k",
    "train.max_steps=20",
    "train.epochs=1",
    "wandb.mode=disabled",
    "checkpoint.every_steps=null",
]
ROLES = {"RayTrainWorker": "worker", "Feeder": "feeder"}  # in the actors' process titles


def _peak_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _watch(peaks: dict, stop: threading.Event) -> None:
    import psutil  # ships with Ray (ray/thirdparty_files), importable once ray is imported

    me = psutil.Process()
    while not stop.is_set():
        for p in me.children(recursive=True):
            try:
                title = " ".join(p.cmdline())
            except psutil.Error:  # exited meanwhile
                continue
            role = next(
                (r for k, r in ROLES.items() if title.startswith("ray::") and k in title), None
            )
            if role:
                key = (role, p.pid)
                peaks[key] = max(peaks.get(key, 0), _peak_kib(p.pid))
        peaks[("driver", me.pid)] = _peak_kib(me.pid)
        stop.wait(0.2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.measure_memory", description=__doc__)
    ap.add_argument("--config", default="configs/local_full.yaml", help="YAML run config")
    add_overrides(ap, "override a config field (repeatable), on top of the 100K-sample preset")
    args = ap.parse_args(argv)
    os.environ.setdefault("WANDB_MODE", "disabled")

    from pipeline.core.config import ConfigError, load_config

    with tempfile.TemporaryDirectory(prefix="bucketray-mem-") as tmp:
        try:
            cfg = load_config(
                args.config,
                [
                    *PRESET,
                    f"checkpoint.storage_path={tmp}",
                    "checkpoint.run_name=mem",
                    *args.overrides,
                ],
            )
        except ConfigError as e:  # a missing or invalid config: a usage error, not a traceback
            ap.error(" ".join(str(e).split()))
        import ray

        from pipeline.train.launch import run  # after validation: a typo fails before Ray loads

        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        peaks: dict = {}
        stop = threading.Event()
        watcher = threading.Thread(target=_watch, args=(peaks, stop), daemon=True)
        watcher.start()
        t0 = time.perf_counter()
        try:
            summary = run(cfg)
        finally:
            stop.set()
            watcher.join()
            ray.shutdown()
    mib = {k: v / 1024 for k, v in peaks.items()}
    print(f"[bucketray] {summary}")
    print(f"run: {cfg.data.synthetic.num_samples:,} samples, {time.perf_counter() - t0:.0f} s")
    for role in ("driver", "worker", "feeder"):
        vals = sorted(v for (r, _), v in mib.items() if r == role)
        if vals:
            print(f"peak RSS {role}: " + ", ".join(f"{v:.0f} MiB" for v in vals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
