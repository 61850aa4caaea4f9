"""Checks the driver makes before it starts anything expensive: pure functions, no Ray calls.

- `check_stable_paths`: inside `ray job submit`, a relative path (any config field marked as a
  location, `pipeline.core.config.path_fields`) would resolve in the job's content-hashed working
  directory: outputs a resubmitted job would not find again, inputs the upload left out.
- `absolute_paths`: a run's relative local paths resolved against the directory it started in,
  as its workers and checkpoints get them (`jobs.evaluate` from another directory finds them).
- `preflight`: the workers plus what Ray Data needs must fit in the cluster, else the run
  deadlocks (workers waiting for data that no CPU is left to read) or waits forever.
- `check_before_start`: what the config alone decides, before Ray starts: the model can be built
  (and, in packed mode, confined to each document), the data is not an unfinished `jobs.tokenize` output, a `delivery.row_cache_dir` can be written.
- `truncation_summary`: how much `data.over_length: truncate` cuts, for one line at run start.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from pipeline.core.config import ConfigError, RunConfig, path_fields

__all__ = [
    "DATA_CPUS",
    "SUBMITTED_JOB_ENV",
    "absolute_paths",
    "check_before_start",
    "check_stable_paths",
    "in_submitted_job",
    "preflight",
]

# The job supervisor sets this in the environment of a `ray job submit` entrypoint (RAY_JOB_ID
# is one of the internal variables Ray strips from it).
SUBMITTED_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
# CPUs left free for Ray Data: its read and map tasks ask one CPU each, and with none free the
# workers wait for batches that are never read.
DATA_CPUS = 1.0


# --------------------------------------------------------------------------- before Ray starts


def check_before_start(cfg: RunConfig) -> None:
    """Errors no worker or retry could fix, found from the config before Ray starts or the
    index is built (each one line naming its key or file)."""
    from pipeline.data.rowcache import check_row_cache_dir
    from pipeline.data.source import check_complete_output
    from pipeline.learn.model_check import check_model, check_packed_model

    check_model(cfg.model)
    if cfg.batching.mode == "packed" and cfg.model.hf_pretrained is None:
        check_packed_model(cfg.model)  # a pretrained one: once its directory is checked
    if cfg.data.path is not None:
        check_complete_output(cfg.data.path)
    if cfg.delivery_used.row_cache:
        check_row_cache_dir(cfg.delivery.row_cache_dir)


# --------------------------------------------------------------------------- stable paths


def in_submitted_job(environ: Mapping[str, str] = os.environ) -> bool:
    return bool(environ.get(SUBMITTED_JOB_ENV))


def check_stable_paths(cfg: RunConfig, environ: Mapping[str, str] = os.environ) -> None:
    """Inside a submitted job, refuse the first relative path among the config's locations
    (every field marked PATH, `path_fields`: one line naming the key and the fix). Outside one,
    relative paths resolve against the current directory."""
    if not in_submitted_job(environ):
        return
    for key, value in path_fields(cfg):
        if is_relative_local(value):
            raise ConfigError(
                f"{key}={value!r} is relative: inside `ray job submit` it resolves in the "
                "job's working directory, a new folder whenever a file changes (and holding only "
                "what was uploaded), so a resubmitted job would not find it; set an absolute "
                f"path or a URI (--set {key}=/shared/... or s3://...)"
            )


def is_relative_local(value: str | None) -> bool:
    """A set local path that is relative (a URI, `~/...` and an absolute path are not)."""
    return bool(value) and "://" not in value and not os.path.isabs(os.path.expanduser(value))


def absolute_paths(raw: dict, cfg: RunConfig, cwd: str | None = None) -> dict:
    """`raw` (cfg's model_dump) with every relative local path of `cfg` (`path_fields`) made
    absolute against `cwd` (default: this process's directory); URIs stay as they are. What
    the workers get, so the config each checkpoint records names its data wherever it is
    read from later."""
    base = cwd or os.getcwd()
    out = json.loads(json.dumps(raw))
    for key, value in path_fields(cfg):
        if is_relative_local(value):
            *parents, last = key.split(".")
            node = out
            for p in parents:
                node = node[p]
            node[last] = os.path.normpath(os.path.join(base, value))
    return out


# --------------------------------------------------------------------------- resources


def _need(cfg: RunConfig) -> tuple[int, dict[str, float]]:
    """(workers that must fit, resources per worker)."""
    s = cfg.scaling
    per = {**s.resources_per_worker, "CPU": s.cpus_per_worker}
    if s.use_gpu:
        per["GPU"] = 1.0
    return (s.min_workers or s.num_workers), per


def preflight(cluster: Mapping[str, float], cfg: RunConfig, *, autoscaling: bool = False) -> None:
    """Raise ConfigError, with the numbers, if `scaling` cannot fit in `cluster` (the resources
    the cluster has, or at most can have) with DATA_CPUS left for Ray Data.

    `autoscaling`: the cluster may grow beyond `cluster` to a size nobody published, so a
    shortfall is not an error (Ray Train waits for the nodes; scaling.start_retries bounds it).
    """
    if autoscaling:
        return
    n, per = _need(cfg)
    workers = "worker" if n == 1 else "workers"
    fix = {
        "CPU": "lower scaling.num_workers (or scaling.min_workers) or scaling.cpus_per_worker",
        "GPU": "lower scaling.num_workers, or set scaling.use_gpu=false",
    }
    for name, amount in per.items():
        have = float(cluster.get(name, 0.0))
        need = n * amount
        extra = DATA_CPUS if name == "CPU" else 0.0
        if need + extra <= have + 1e-9:
            continue
        what = f"{n} {workers} x {amount:g} {name}"
        if extra:
            what += f" + {extra:g} CPU for Ray Data"
        raise ConfigError(
            f"{what} = {need + extra:g} {name} > {have:g} in the cluster: "
            + fix.get(name, f"drop {name} from scaling.resources_per_worker or add nodes with it")
            + " (on a cluster that adds nodes on demand: scaling.autoscaling=true)"
        )


# --------------------------------------------------------------------------- truncation
