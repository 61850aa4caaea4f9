"""The driver's side of the data, shared by `jobs.train` (`pipeline.train.launch`) and the
own-loop API (`pipeline.data.api`): one setup, so the two paths cannot drift apart.

    data = find_run_data(cfg)                          # data path, length index, bucket edges
    plan = plan_run(cfg, data, world_size=W)           # every epoch the run reaches, at W ranks
    start_run_feeder(cfg, data, plan, name=n, at=(e, s), world_size=W)

`plan_run` plans at the world size the workers will have, so what depends on it (a packed
plan's rows_per_step must split evenly over the ranks) is refused on the driver, and records
each epoch's plan hash: the workers hand it to `rank_batches`, which refuses a feeder answer
planned differently (`PlanMismatchError`). `start_run_feeder` starts the feeder and, where the
world size is known, the range the first request will ask for (a lead-in's first, from the
position the run starts at), so its read overlaps the workers' start-up instead of following
their first request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.core.config import ConfigError, RunConfig
from pipeline.core.epochs import resolve_edges, run_epoch_plans
from pipeline.core.plan import EpochPlan
from pipeline.core.runlength import run_length
from pipeline.data.feeder import start_feeder
from pipeline.data.index import LengthIndex, build_length_index, resolve_data_path

__all__ = [
    "RunData",
    "RunPlan",
    "find_run_data",
    "fixed_world_size",
    "plan_run",
    "run_position",
    "start_run_feeder",
]


@dataclass(frozen=True)
class RunData:
    """The run's data as the driver finds it."""

    path: str  # the data (directory or URI)
    index: LengthIndex
    edges: list[int]  # bucket edges [0, e1, ..., top]


@dataclass(frozen=True)
class RunPlan:
    """Every epoch the run reaches (train.epochs, cut at train.max_steps), planned on the driver."""

    world_size: int  # the world size the epochs were planned at
    hashes: list[str]  # each epoch's EpochPlan.content_hash (the same at every world size)
    steps: list[int]  # each epoch's global steps (with greedy fill, epochs differ slightly)
    total_steps: int  # global steps of the whole run
    described: list[dict]  # per epoch, what `plan_run`'s `describe` returned ({} without one)


def find_run_data(cfg: RunConfig) -> RunData:
    """Find (or build) the data, index it (contract 10's checks, cached) and choose the edges."""
    path = resolve_data_path(cfg)
    index = build_length_index(cfg, path)
    return RunData(path, index, [int(e) for e in resolve_edges(cfg, index.lengths)])


def fixed_world_size(cfg: RunConfig) -> int | None:
    """The workers' world size when the config fixes it; None for elastic training, whose world
    size is only known in the workers."""
    n = cfg.scaling.ray_num_workers()
    return n if isinstance(n, int) else None


def plan_run(
    cfg: RunConfig,
    data: RunData,
    *,
    world_size: int,
    describe: Callable[[EpochPlan], dict] | None = None,
) -> RunPlan:
    """Plan every epoch the run reaches at `world_size`; `describe(plan)` (e.g. the `epoch/*`
    metrics) is kept per epoch, so no epoch is planned twice. An epoch without a step is a
    ConfigError."""
    hashes, steps, described = [], [], []
    for plan in run_epoch_plans(cfg, data.index, data.edges, world_size):
        if plan.num_steps == 0:
            raise ConfigError(
                f"no training steps: {len(data.index.lengths)} valid samples under buckets "
                f"{data.edges} (with batching.drop_remainder, every bucket may be smaller than "
                "one global batch)"
            )
        hashes.append(plan.content_hash)
        steps.append(plan.num_steps)
        described.append(describe(plan) if describe is not None else {})
    return RunPlan(world_size, hashes, steps, run_length(steps, cfg.train).global_steps, described)


def run_position(plan: RunPlan, global_step: int) -> tuple[int, int] | None:
    """(epoch, step in that epoch) of the run's `global_step`; None at or past the run's end."""
    first = 0
    for epoch, n in enumerate(plan.steps):
        if global_step < min(first + n, plan.total_steps):
            return epoch, global_step - first
        first += n
    return None


def start_run_feeder(
    cfg: RunConfig,
    data: RunData,
    plan: RunPlan,
    *,
    name: str,
    world_size: int | None,
    at: tuple[int, int] | None = (0, 0),
):
    """Start the feeder actor `name`; returns its handle. With a known `world_size` and a
    position `at` (epoch, step) inside the run, the range a stream starting there asks for first
    starts preparing now, without waiting (`Feeder.start_at`)."""
    feeder = start_feeder(cfg, data.index, data.edges, name=name, path=data.path)
    if world_size is not None and at is not None and at[0] < len(plan.steps):
        feeder.start_at.remote(at[0], world_size, at[1])
    return feeder
