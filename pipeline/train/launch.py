"""Driver side of a training run: data, edges and epoch plans on the driver, then TorchTrainer.fit.

Joins the cluster named by --address or RAY_ADDRESS (set by `ray job submit`), else starts a
private local Ray instance; checks what can be checked before any worker starts (stable paths
inside a submitted job, resources, the resume position against the current plan); takes the
run directory's lease; starts the run's warning collector (the feeder's, the index tasks' and
the workers' warnings reach this console once each); builds the length index and bucket edges
once, plans the epochs (for their hashes and `epoch/*` summaries), starts the data layer's
feeder actor and runs `pipeline.train.loop.train_loop` on `scaling.num_workers` workers. Resubmitting with the same
checkpoint.storage_path and run_name resumes: Ray Train hands the loop its latest checkpoint.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow.fs as pafs

from pipeline.core.config import ConfigError, RunConfig
from pipeline.core.epochs import packed_epoch_metrics
from pipeline.core.length_ranges import run_ranges
from pipeline.core.plan import EpochPlan
from pipeline.data.connect import CONNECT_TIMEOUT_S, connect
from pipeline.data.driver import (
    RunData,
    RunPlan,
    find_run_data,
    fixed_world_size,
    plan_run,
    start_run_feeder,
)
from pipeline.data.run_warnings import ConsoleRelay, collector_name, start_collector
from pipeline.learn.checkpoint import SAVE_FAIL_ENV
from pipeline.train.console import (
    WORKER_ENV,
    quiet_driver_logging,
    quiet_ray_data,
    show_run_lines_only,
)
from pipeline.train.control import trainer_class, user_error
from pipeline.train.evaluate_run import check_async_room
from pipeline.train.loop import (
    FAIL_AT_STEP_ENV,
    FAIL_MARKER_ENV,
    FAIL_RANK_ENV,
    LoopInputs,
    train_loop,
)
from pipeline.train.picture_jumpiness import print_run_jumpiness
from pipeline.train.preflight import (
    absolute_paths,
    check_before_start,
    check_stable_paths,
    preflight,
)
from pipeline.train.reference import driver_reference
from pipeline.train.resume_check import (
    check_resume_on_driver,
    data_file_digests,
    latest_position,
    truncation_metrics,
    truncation_note,
)
from pipeline.train.run_record import write_heldout_record
from pipeline.train.runlock import RunLease, signals_interrupt
from pipeline.train.stop import create_stop_flag, request_stop, stop_flag_name

__all__ = [
    "TrainSummary",
    "epoch_metrics",
    "init_ray",
    "run",
    "run_dir",
    "storage_path",
]

# Environment forwarded from the driver to the workers: W&B mode (never the key) and the
# fault-injection knobs tests use. A cluster provides WANDB_API_KEY to its workers itself.
FORWARDED_ENV = ("WANDB_MODE", FAIL_AT_STEP_ENV, FAIL_MARKER_ENV, FAIL_RANK_ENV, SAVE_FAIL_ENV)
# How long the resources of a cluster just joined may take to cover the run's workers.
NODES_WAIT_S = 60.0


@dataclass(frozen=True)
class TrainSummary:
    steps: int
    tokens: int
    samples: int
    loss: float
    padding_efficiency: float
    checkpoint: str | None
    seconds: float
    stopped: bool = False  # ended early on request (SIGINT / SIGTERM), with a checkpoint
    picture: str | None = None  # the run's PNG (pipeline.train.run_picture), if one was drawn

    def __str__(self) -> str:
        head = "stopped on request after" if self.stopped else "trained"
        tail = " | resubmit the same command to resume" if self.stopped else ""
        return (
            f"{head} {self.steps} global steps, {self.samples:,} samples, {self.tokens:,} real tokens "
            f"in {self.seconds:.0f} s | final loss {self.loss:.4f} | padding efficiency "
            f"{self.padding_efficiency:.3f} | checkpoint {self.checkpoint}{tail}"
        )


def check_pretrained_model(cfg: RunConfig, max_positions: int) -> None:
    """What the driver can check of the model before any worker starts: a pretrained directory's
    files, weights and limits, and in packed mode its attention (one ConfigError line instead
    of a failure in every worker)."""
    if cfg.model.hf_pretrained is not None:
        from pipeline.learn.model_check import check_packed_model
        from pipeline.learn.pretrained import check_pretrained

        check_pretrained(cfg.model, max_positions)
        if cfg.batching.mode == "packed":
            check_packed_model(cfg.model)


def storage_path(cfg: RunConfig) -> str:
    """checkpoint.storage_path, made absolute when it is a local path (Ray Train needs that)."""
    p = cfg.checkpoint.storage_path
    return p if "://" in p else os.path.abspath(os.path.expanduser(p))


def _storage(cfg: RunConfig):
    """(storage_path, storage_filesystem) for Ray Train's RunConfig.

    A URI is resolved here, on the driver: Ray Train's controller would otherwise resolve it
    from its own environment, so an endpoint set only for the job's driver (AWS_ENDPOINT_URL)
    would not reach it. The filesystem carries the endpoint, never the credentials.
    """
    from pipeline.data.index import filesystem_for

    p = storage_path(cfg)
    if "://" not in p:
        return p, None
    fs, path = filesystem_for(p)
    return path, fs


def _checkpoint_uri(checkpoint) -> str | None:
    """Where a Ray Train checkpoint lives, with the scheme Ray strips from its path (s3://...)."""
    if checkpoint is None:
        return None
    fs = checkpoint.filesystem
    if fs is None or fs.type_name == "local":
        return checkpoint.path
    return f"{fs.type_name}://{checkpoint.path}"


def run_dir(cfg: RunConfig) -> str:
    return f"{storage_path(cfg).rstrip('/')}/{cfg.checkpoint.run_name}"


def epoch_metrics(plan: EpochPlan) -> dict:
    """`epoch/*` metrics: steps, samples and tokens per bucket, planned padding efficiency, hash.
    Micro-batches are capped at their bucket's edge in the plan's own edges (a sorted or random
    plan is one bucket, whatever edges the config names)."""
    s = plan.summary()
    out = {
        "epoch/steps": s["steps"],
        "epoch/samples": s["samples"],
        "epoch/tokens": s["tokens"],
        "epoch/planned_padding_efficiency": plan.planned_padding_efficiency(),
        "epoch/plan_hash": s["hash"],
    }
    for name in ("steps", "samples", "tokens"):
        for k, v in enumerate(s[f"{name}_per_bucket"]):
            out[f"epoch/{name}_per_bucket/{k}"] = int(v)
    return out


def init_ray(
    address: str | None = None, *, timeout_s: float = CONNECT_TIMEOUT_S, debug: bool = False
) -> bool:
    """Start or join Ray: `address` (the --address flag), else RAY_ADDRESS, else a private local
    instance. A given address that does not answer within `timeout_s` is a one-line
    ConfigError, not minutes of silent retries. Unless `debug`, the console shows the run's own
    lines only (`pipeline.train.console`). True if it joined a running cluster."""
    joined, ctx = connect(address, timeout_s=timeout_s, logging_level=quiet_driver_logging(debug))
    if ctx is None:  # Ray was up already (a test's cluster, the own-loop API's caller)
        return False
    quiet_ray_data(debug)
    if not debug:
        show_run_lines_only()
        logs = f"{ctx.address_info.get('session_dir', '/tmp/ray/session_latest')}/logs"
        print(f"[bucketray] Ray's own output: {logs} (--debug prints it here)", flush=True)
    return joined


def _cluster_capacity(cfg: RunConfig) -> tuple[dict, bool]:
    """(resources to check the workers against, whether the cluster may grow past them)."""
    import ray

    try:  # an autoscaler that publishes its node groups gives the most the cluster can have
        from ray._private.state import state

        most = state.get_max_resources_from_cluster_config()
    except Exception:  # private API: no published maximum is the safe reading
        most = None
    if most:
        return {k: float(v) for k, v in most.items()}, False
    return ray.cluster_resources(), cfg.scaling.autoscaling


def _check_resources(cfg: RunConfig, *, wait_s: float) -> None:
    """`preflight` against the cluster. A cluster just joined may still be registering its
    nodes (a RayJob is submitted once its pods run), so a shortfall is re-checked for up to
    `wait_s` seconds before the run is refused."""
    deadline = time.monotonic() + wait_s
    while True:
        capacity, autoscaling = _cluster_capacity(cfg)
        try:
            preflight(capacity, cfg, autoscaling=autoscaling)
            # eval.mode=async: its task must fit beside the workers, or it runs after them.
            return check_async_room(capacity, cfg, autoscaling=autoscaling)
        except ConfigError:
            if time.monotonic() >= deadline:
                raise
        time.sleep(5.0)


def _run_fs(cfg: RunConfig) -> tuple[pafs.FileSystem, str]:
    """The run directory's filesystem and path on it (no scheme), for the lease and the resume check."""
    path, fs = _storage(cfg)
    return fs or pafs.LocalFileSystem(), f"{path.rstrip('/')}/{cfg.checkpoint.run_name}"


def _plan_epochs(cfg: RunConfig, data: RunData) -> tuple[RunPlan, list[dict]]:
    """Plan every epoch the run reaches (up to train.max_steps) at scaling.num_workers: the plan
    and, per epoch, its hash and `epoch/*` metrics."""

    def describe(plan: EpochPlan) -> dict:
        return {
            **epoch_metrics(plan),
            **packed_epoch_metrics(plan),
            **truncation_metrics(data.index),
        }

    plan = plan_run(cfg, data, world_size=cfg.scaling.num_workers, describe=describe)
    epochs = [{"hash": h, "metrics": m} for h, m in zip(plan.hashes, plan.described, strict=True)]
    return plan, epochs


def run(cfg: RunConfig, *, address: str | None = None, debug: bool = False) -> TrainSummary:
    """Prepare data, train to the end of the configured run, draw its picture, return the final
    summary."""
    t0 = time.perf_counter()
    check_stable_paths(cfg)
    check_before_start(cfg)
    fs, rdir = _run_fs(cfg)
    # The lease first: a second run of the same name is refused before Ray starts or the index
    # is built. SIGTERM while preparing interrupts as Ctrl-C does, so the lease is released.
    with RunLease(fs, rdir), signals_interrupt():
        return _run_leased(cfg, address, fs, rdir, t0, debug)


def _run_leased(
    cfg: RunConfig, address: str | None, fs, rdir: str, t0: float, debug: bool = False
) -> TrainSummary:
    _check_resources(cfg, wait_s=NODES_WAIT_S if init_ray(address, debug=debug) else 0.0)
    with _warnings_relay(cfg) as warnings_to:
        return _train(cfg, fs, rdir, t0, warnings_to)


@contextmanager
def _warnings_relay(cfg: RunConfig) -> Iterator[str | None]:
    """The run's warning collector, and the console lines of what it receives: warnings of the
    feeder, the index tasks and the workers, once each (`pipeline.data.run_warnings`)."""
    import ray

    if not ray.is_initialized():  # a caller standing in for Ray: nothing to collect from
        yield None
        return
    name = collector_name(f"{cfg.checkpoint.run_name}-{uuid.uuid4().hex[:8]}")
    collector = start_collector(name)
    try:
        with ConsoleRelay(name):
            yield name
    finally:
        ray.kill(collector)


def _train(cfg: RunConfig, fs, rdir: str, t0: float, warnings_to: str | None) -> TrainSummary:
    import ray

    from pipeline.data.rowcache import RowCache

    data = find_run_data(cfg)
    index, edges = data.index, data.edges
    check_pretrained_model(cfg, edges[-1])
    # Every epoch the run reaches is planned here: with greedy fill, steps per epoch vary
    # slightly between epochs, and the schedule, progress and resume use these planned counts.
    plan, epochs = _plan_epochs(cfg, data)
    steps, total = plan.steps, plan.total_steps
    files = data_file_digests(index)
    horizon = check_resume_on_driver(cfg, fs, rdir, edges, epochs, files, steps_per_epoch=steps)
    if horizon:
        print(f"[bucketray] {horizon}", flush=True)
    note = truncation_note(index)
    if note:
        print(f"[bucketray] {note}", flush=True)
    held_out = _held_out(cfg, data, total)
    reference = driver_reference(cfg.eval, *_run_fs(cfg))
    rows = RowCache.for_run(cfg, index, warn=True)
    print(f"[bucketray] {rows.describe() if rows else _no_row_cache(cfg)}", flush=True)
    S = f"{min(steps)}-{max(steps)}" if min(steps) != max(steps) else str(steps[0])
    print(
        f"[bucketray] {len(index.lengths):,} samples, edges {edges}, {S} steps/epoch, "
        f"{total} steps on {cfg.scaling.num_workers} workers -> {run_dir(cfg)}",
        flush=True,
    )
    # The stop flag is owned by this driver and dies with it: a request can only be this run's.
    flag = create_stop_flag(stop_flag_name(cfg.checkpoint.run_name))
    feeder_name = f"bucketray-feeder-{cfg.checkpoint.run_name}-{uuid.uuid4().hex[:8]}"
    found = latest_position(fs, rdir)  # where the workers will start: the first range starts now
    at = (found[1].epoch, found[1].next_step) if found else (0, 0)
    feeder = start_run_feeder(
        cfg, data, plan, name=feeder_name, world_size=fixed_world_size(cfg), at=at
    )
    try:
        inputs = _loop_inputs(cfg, feeder_name, edges, steps, epochs, files, warnings_to, held_out)
        inputs = replace(inputs, ranges=run_ranges(index.lengths, edges), reference=reference)
        result = _fit(cfg, inputs, flag)
    finally:
        ray.kill(feeder)
        ray.kill(flag)
    m = result.metrics or {}
    return TrainSummary(
        steps=int(m.get("steps", 0)),
        tokens=int(m.get("tokens", 0)),
        samples=int(m.get("samples", 0)),
        loss=float(m.get("loss", float("nan"))),
        padding_efficiency=float(m.get("padding_efficiency", float("nan"))),
        checkpoint=_checkpoint_uri(result.checkpoint),
        seconds=time.perf_counter() - t0,
        stopped=bool(m.get("stopped", 0)),
        picture=_draw_picture(cfg),
    )


def _draw_picture(cfg: RunConfig) -> str | None:
    """The run's PNG beside its checkpoints (uploaded there for a remote storage path). A picture
    that cannot be drawn is a warning, never a failed run: the checkpoints are what matter."""
    import tempfile
    import warnings

    from pipeline.train.run_picture import PICTURE_FILE, draw_run

    target = f"{run_dir(cfg)}/{PICTURE_FILE}"
    try:
        print_run_jumpiness(run_dir(cfg))
        if "://" not in target:
            return draw_run(run_dir(cfg), target)
        fs, path = _run_fs(cfg)
        with tempfile.TemporaryDirectory() as d:
            local = draw_run(run_dir(cfg), f"{d}/{PICTURE_FILE}")
            pafs.copy_files(local, f"{path}/{PICTURE_FILE}", destination_filesystem=fs)
        return target
    except Exception as e:  # noqa: BLE001 - reported, and the run's result stands
        warnings.warn(f"could not draw the run's picture: {type(e).__name__}: {e}", stacklevel=2)
        return None


def _held_out(cfg: RunConfig, data: RunData, total_steps: int) -> list:
    """[ObjectRef of the run's held-out set] for the workers (read and checked here, once, at
    the run's own top edge), or [] without an `eval:` section."""
    if cfg.eval is None:
        return []
    import ray

    from pipeline.data.evalset import load_eval_set

    cfg.eval.check_reaches(total_steps)  # an epochs-based run's length is known only here
    held_out = load_eval_set(cfg, data.index, top=data.edges[-1])
    print(f"[bucketray] {held_out.describe()}", flush=True)
    write_heldout_record(*_run_fs(cfg), held_out)  # what jobs.compare_runs checks runs share
    return [ray.put(held_out)]


def _loop_inputs(
    cfg: RunConfig,
    feeder: str,
    edges: list[int],
    steps: list[int],
    epochs: list[dict],
    data_files: dict,
    warnings_to: str | None = None,
    eval_set: list | None = None,
):
    wandb_dir = cfg.wandb.dir or (run_dir(cfg) if "://" not in run_dir(cfg) else "wandb")
    return LoopInputs(
        # Absolute, so that the config each checkpoint records finds the run's data from any
        # directory (jobs.evaluate), and the workers write where the driver's paths point.
        cfg=absolute_paths(cfg.model_dump(mode="json"), cfg),
        feeder=feeder,
        edges=edges,
        steps_per_epoch=steps,
        epochs=epochs,
        wandb_dir=str(Path(wandb_dir).absolute()) if "://" not in wandb_dir else "wandb",
        data_files=data_files,
        warnings=warnings_to,
        eval_set=list(eval_set or []),
    )


def _validation_config(cfg: RunConfig, inputs: LoopInputs):
    """eval.mode=async: Ray Train's ValidationConfig running `validate_checkpoint` on each
    checkpoint reported for evaluation, with one worker's resources; None otherwise."""
    if cfg.eval is None or cfg.eval.mode != "async" or not inputs.eval_set:
        return None
    from functools import partial

    from ray.train.v2.api.validation_config import ValidationConfig

    from pipeline.train.evaluate_run import validate_checkpoint, validation_resources

    fn = partial(
        validate_checkpoint,
        eval_set=inputs.eval_set,
        edges=inputs.edges,
        run_dir=run_dir(cfg),
        ranges=list(inputs.ranges),
    )
    return ValidationConfig(fn=fn, ray_remote_kwargs=validation_resources(cfg.scaling))


def _fit(cfg: RunConfig, inputs: LoopInputs, stop_flag):
    """TorchTrainer.fit with bounded start-up retries, deterministic errors raised at the first
    failure (and unwrapped from Ray's WorkerGroupError), SIGINT/SIGTERM asking for a graceful
    stop."""
    import ray.train

    resources = {**cfg.scaling.resources_per_worker, "CPU": cfg.scaling.cpus_per_worker}
    if cfg.scaling.use_gpu:
        resources["GPU"] = 1
    train_storage_path, train_storage_fs = _storage(cfg)
    trainer = trainer_class(lambda: request_stop(stop_flag, "signal"))(
        train_loop,
        train_loop_config=inputs.to_dict(),
        validation_config=_validation_config(cfg, inputs),
        scaling_config=ray.train.ScalingConfig(
            num_workers=cfg.scaling.ray_num_workers(),
            use_gpu=cfg.scaling.use_gpu,
            resources_per_worker=resources,
        ),
        run_config=ray.train.RunConfig(
            name=cfg.checkpoint.run_name,
            storage_path=train_storage_path,
            storage_filesystem=train_storage_fs,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.checkpoint.keep_last),
            failure_config=ray.train.FailureConfig(
                max_failures=cfg.checkpoint.max_failures,
                controller_failure_limit=cfg.scaling.start_retries,
            ),
            worker_runtime_env={
                "env_vars": {
                    **WORKER_ENV,
                    **{k: os.environ[k] for k in FORWARDED_ENV if k in os.environ},
                }
            },
        ),
    )
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return trainer.fit()
    except ray.train.TrainingFailedError as e:
        cause = user_error(e)
        if cause is None:
            raise
        raise cause from None
    finally:
        if threading.current_thread() is threading.main_thread():
            for s, h in handlers.items():
                signal.signal(s, h)


def _no_row_cache(cfg) -> str:
    """The console line of a run without the row cache, saying why and how rows are read."""
    if cfg.delivery_used.row_cache:  # asked for, and no directory could be written
        return "row cache off (no writable directory for it): each chapter read by a Ray Data pass"
    if cfg.delivery.row_cache is None:  # left to its default, which windows turn off
        return (
            "row cache off with plan.window_tokens: each window's row groups are read once per "
            "epoch by its Ray Data pass (delivery.row_cache=true reads them in the feeder)"
        )
    return "row cache off (delivery.row_cache=false): each chapter read by a Ray Data pass"
