"""One metric-logger interface: W&B on rank 0, a no-op elsewhere, lists and JSON lines for tests.

The train loop calls `logger.log(metrics, step)` on every rank without checking its rank;
`make_logger` hands non-zero ranks a `NullLogger`. W&B keys come only from the environment
(WANDB_API_KEY) and are never logged or written into the config.
"""

from __future__ import annotations

import json
import os
import secrets
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
    "new_run_id",
    "wandb_mode",
    "make_logger",
]


class MetricLogger(Protocol):
    def log(self, metrics: dict[str, Any], step: int) -> None: ...

    def finish(self) -> None: ...


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

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.records.append((step, dict(metrics)))

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
    """A W&B run; `resume="allow"` with a stored id continues the same run after a restart."""

    def __init__(self, cfg: RunConfig, *, run_id: str, mode: str, directory: str):
        import wandb  # imported here: workers without W&B never pay for it

        Path(directory).mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=cfg.wandb.project,
            entity=cfg.wandb.entity,
            name=cfg.checkpoint.run_name,
            id=run_id,
            resume="allow",
            mode=mode,
            dir=directory,
            tags=cfg.wandb.tags,
            config=cfg.model_dump(mode="json"),
        )

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self._run.log(metrics, step=step)

    def finish(self) -> None:
        self._run.finish()


class TeeLogger:
    """Sends every call to each of its loggers."""

    def __init__(self, *loggers: MetricLogger):
        self.loggers = loggers

    def log(self, metrics: dict[str, Any], step: int) -> None:
        for lg in self.loggers:
            lg.log(metrics, step)

    def finish(self) -> None:
        for lg in self.loggers:
            lg.finish()


def new_run_id() -> str:
    """A fresh W&B-style run id (8 lowercase hex characters)."""
    return secrets.token_hex(4)


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
    """Rank 0: W&B (unless disabled), plus a JSON-lines file when `metrics_file` is given.
    Other ranks: a NullLogger."""
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
    return loggers[0] if len(loggers) == 1 else TeeLogger(*loggers)
