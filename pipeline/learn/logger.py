"""One metric-logger interface: W&B on rank 0, a no-op elsewhere, lists and JSON lines for tests.

The train loop calls `logger.log(metrics, step)` on every rank without checking its rank;
`make_logger` hands non-zero ranks a `NullLogger`. W&B keys come only from the environment
(WANDB_API_KEY) and are never logged or written into the config.

Curves continue across restarts: the W&B run id is derived from the run's resolved storage
directory (`run_id_for`), so every attempt of a run, with or without a checkpoint, logs into the
same W&B run; and rank 0's logger skips every step at or below the highest step a previous
attempt logged (`SkipLoggedSteps`), so steps re-trained after a restart are logged once.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any, Protocol

from pipeline.core.config import RunConfig

__all__ = [
    "MetricLogger",
    "NullLogger",
    "ListLogger",
    "JsonlLogger",
    "WandbLogger",
    "TeeLogger",
    "SkipLoggedSteps",
    "log_summary",
    "run_id_for",
    "wandb_mode",
    "make_logger",
    "REAL_TOKENS",
    "ELAPSED_S",
    "define_axes",
]

# Logged with every training and held-out point: runs of different batch sizes take different
# numbers of steps for the same tokens, so they are compared at equal real tokens (or training
# time), never at equal steps.
REAL_TOKENS = "progress/real_tokens"  # real (unpadded) tokens trained so far, all ranks
ELAPSED_S = "progress/elapsed_s"  # seconds of training steps so far (evaluations excluded)


def define_axes(run: Any) -> None:
    """Declare the x axes of a W&B run: real tokens (the default of the `train/*` and `eval/*`
    series) and elapsed training time (selectable beside it), each its own step metric."""
    run.define_metric(REAL_TOKENS)
    run.define_metric(ELAPSED_S)
    for series in ("train/*", "eval/*", "data/*", "perf/*"):
        run.define_metric(series, step_metric=REAL_TOKENS)


class MetricLogger(Protocol):
    def log(self, metrics: dict[str, Any], step: int) -> None: ...

    def finish(self) -> None: ...


def log_summary(logger: Any, values: dict[str, Any]) -> None:
    """Put `values` into the run's summary (not a step's metrics): W&B's run summary, a
    ListLogger's `summary`; loggers without one (a JSON-lines file, a NullLogger) skip it."""
    put = getattr(logger, "summary", None)
    if callable(put):
        put(values)


class NullLogger:
    """Logs nothing: non-zero ranks, and W&B disabled without a metrics file."""

    def log(self, metrics: dict[str, Any], step: int) -> None:
        pass

    def finish(self) -> None:
        pass


class ListLogger:
    """Keeps every call in memory: `records` is a list of (step, metrics)."""

    def __init__(self) -> None:
        self.records: list[tuple[int, dict[str, Any]]] = []
        self.summaries: dict[str, Any] = {}

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.records.append((step, dict(metrics)))

    def summary(self, values: dict[str, Any]) -> None:
        self.summaries.update(values)

    def finish(self) -> None:
        pass

    def keys(self) -> set[str]:
        return {k for _, m in self.records for k in m}


class JsonlLogger:
    """Appends one JSON object per call, {"step": s, **metrics}; readable across processes."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")

    def finish(self) -> None:
        pass


class WandbLogger:
    """A W&B run; `resume="allow"` with the run's fixed id continues the same run after a restart.

    wandb.init may take `cfg.wandb.init_timeout_s`; an online run that cannot reach the server in
    that time falls back to offline with a warning (upload later with `wandb sync`)."""

    def __init__(self, cfg: RunConfig, *, run_id: str, mode: str, directory: str):
        import wandb  # imported here: workers without W&B never pay for it

        Path(directory).mkdir(parents=True, exist_ok=True)
        kw = dict(
            project=cfg.wandb.project,
            entity=cfg.wandb.entity,
            name=cfg.checkpoint.run_name,
            id=run_id,
            resume="allow",
            dir=directory,
            tags=cfg.wandb.tags,
            config=cfg.model_dump(mode="json"),
            settings=wandb.Settings(init_timeout=cfg.wandb.init_timeout_s),
        )
        try:
            self._run = wandb.init(mode=mode, **kw)
        except Exception as e:  # noqa: BLE001 -- any failure to reach W&B: log offline instead
            if mode != "online":
                raise
            warnings.warn(
                f"wandb.init online failed within wandb.init_timeout_s={cfg.wandb.init_timeout_s:g} "
                f"({type(e).__name__}): logging offline instead (upload later with `wandb sync`)",
                stacklevel=2,
            )
            wandb.teardown()  # the W&B service still holds the failed run's id
            self._run = wandb.init(mode="offline", **kw)
        self.mode = "offline" if self._run.settings._offline else mode
        define_axes(self._run)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self._run.log(metrics, step=step)

    def summary(self, values: dict[str, Any]) -> None:
        self._run.summary.update(values)

    def finish(self) -> None:
        self._run.finish()


class TeeLogger:
    """Sends every call to each of its loggers."""

    def __init__(self, *loggers: MetricLogger):
        self.loggers = loggers

    def log(self, metrics: dict[str, Any], step: int) -> None:
        for lg in self.loggers:
            lg.log(metrics, step)

    def summary(self, values: dict[str, Any]) -> None:
        for lg in self.loggers:
            log_summary(lg, values)

    def finish(self) -> None:
        for lg in self.loggers:
            lg.finish()


class SkipLoggedSteps:
    """Passes on only steps above the highest step an earlier attempt of the run logged.

    A restart re-trains the steps after its checkpoint; they were logged already (with the same
    values: resume is exact), and W&B requires steps to increase. The highest step logged is kept
    in `state_file`, rewritten after every call; calls at one step within an attempt all pass."""

    def __init__(self, inner: MetricLogger, state_file: str | os.PathLike):
        self.inner = inner
        self.path = Path(state_file)
        self.floor = json.loads(self.path.read_text())["step"] if self.path.is_file() else -1
        self.last = self.floor

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if step <= self.floor:
            return
        self.inner.log(metrics, step)
        if step > self.last:
            self.last = step
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps({"step": step}))
            os.replace(tmp, self.path)

    def summary(self, values: dict[str, Any]) -> None:
        log_summary(self.inner, values)

    def finish(self) -> None:
        self.inner.finish()


def run_id_for(run_dir: str) -> str:
    """The W&B run id of the run stored at `run_dir` (the resolved storage path joined with
    checkpoint.run_name): 12 hex characters of its SHA-256, the same on every attempt."""
    return hashlib.sha256(run_dir.rstrip("/").encode()).hexdigest()[:12]


def wandb_mode(cfg: RunConfig) -> str:
    """The effective W&B mode: WANDB_MODE from the environment wins (tests set `disabled`);
    `online` without WANDB_API_KEY falls back to `offline` with a warning instead of prompting."""
    mode = os.environ.get("WANDB_MODE") or cfg.wandb.mode
    if mode == "online" and not os.environ.get("WANDB_API_KEY"):
        warnings.warn(
            "wandb.mode=online but WANDB_API_KEY is not set in the environment: logging offline "
            "(upload later with `wandb sync`)",
            stacklevel=2,
        )
        mode = "offline"
    return mode


def make_logger(
    cfg: RunConfig, *, rank: int, run_id: str, wandb_dir: str, metrics_file: str | None = None
) -> MetricLogger:
    """Rank 0: W&B (unless disabled), plus a JSON-lines file when `metrics_file` is given, behind
    SkipLoggedSteps (its state file lives in `wandb_dir`). Other ranks: a NullLogger."""
    if rank != 0:
        return NullLogger()
    loggers: list[MetricLogger] = []
    mode = wandb_mode(cfg)
    if mode != "disabled":
        loggers.append(WandbLogger(cfg, run_id=run_id, mode=mode, directory=wandb_dir))
    if metrics_file:
        loggers.append(JsonlLogger(metrics_file))
    if not loggers:
        return NullLogger()
    inner = loggers[0] if len(loggers) == 1 else TeeLogger(*loggers)
    Path(wandb_dir).mkdir(parents=True, exist_ok=True)
    return SkipLoggedSteps(inner, Path(wandb_dir) / f"bucketray-logged-step-{run_id}.json")
