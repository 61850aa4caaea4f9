"""Evaluate a checkpoint on its own: the driver side of `jobs.evaluate`.

The checkpoint's own config (`run_config.json`, with `--set` overrides on top) names the model
and the held-out set; the driver reads and checks the held-out set once (as a training run's
driver does), and `scaling.num_workers` Ray Train workers each load the checkpoint's weights
and evaluate their share of the held-out plan, the sums all-reduced: the same `eval/*` figures
a run logs at that step, on any number of workers.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.config import ConfigError, RunConfig, apply_overrides, validate
from pipeline.core.deliveryconfig import upgrade_recorded
from pipeline.data.fs import filesystem_for
from pipeline.learn.checkpoint import (
    RUN_CONFIG_FILE,
    STATE_FILE,
    CheckpointError,
    DataPosition,
    checkpoint_files,
)

__all__ = [
    "ASYNC_EVALS_DIR",
    "check_async_room",
    "checkpoint_ranges",
    "validation_resources",
    "EVAL_RESULT_FILE",
    "read_async_evals",
    "validate_checkpoint",
    "EvalTarget",
    "eval_loop",
    "evaluate_checkpoint",
    "find_checkpoint",
    "target_config",
]

EVAL_RESULT_FILE = "eval.json"
# eval.mode=async: one JSON record per evaluation, <run dir>/evals/step_<8 digits>.json.
ASYNC_EVALS_DIR = "evals"
ASYNC_RANGES_KEY = "range_edges"  # in such a record: the run's length ranges, where it has them


@dataclass(frozen=True)
class EvalTarget:
    """The checkpoint to evaluate: where it is (local path or URI) and its data position."""

    uri: str
    position: DataPosition

    @property
    def edges(self) -> list[int]:
        return [int(e) for e in self.position.global_batch["buckets.edges"]]


def _read_json(fs, path: str) -> dict:
    with fs.open_input_stream(path) as f:
        return json.loads(f.read())


def find_checkpoint(run_dir: str, name: str | None = None) -> EvalTarget:
    """The run's latest complete checkpoint, or the one called `name` (checkpoint_step...)."""
    from pipeline.train.resume_check import latest_position

    fs, root = filesystem_for(run_dir)
    scheme = run_dir.split("://", 1)[0] + "://" if "://" in run_dir else ""
    if name is None:
        found = latest_position(fs, root.rstrip("/"))
        if found is None:
            raise CheckpointError(f"no complete checkpoint under {run_dir}: nothing to evaluate")
        path, position = found
    else:
        path = f"{root.rstrip('/')}/{name}"
        try:
            meta = _read_json(fs, f"{path}/{STATE_FILE}")
        except FileNotFoundError:
            raise CheckpointError(
                f"{run_dir}/{name} is not a complete checkpoint (no {STATE_FILE})"
            ) from None
        position = DataPosition.from_dict(meta["position"])
    return EvalTarget(f"{scheme}{path}", position)


def target_config(target: EvalTarget, overrides: list[str]) -> RunConfig:
    """The checkpoint's config with `overrides` on top; an `eval:` section is required."""
    fs, path = filesystem_for(target.uri)
    try:
        raw = _read_json(fs, f"{path}/{RUN_CONFIG_FILE}")
    except FileNotFoundError:
        raise CheckpointError(
            f"{target.uri} has no {RUN_CONFIG_FILE}: it was written before runs recorded their "
            "config; evaluate a checkpoint of a newer run"
        ) from None
    # A checkpoint written before the delivery section existed recorded its keys under data.
    cfg = validate(apply_overrides(upgrade_recorded(raw), overrides))
    if cfg.eval is None:
        raise ConfigError(
            "no held-out set: the run had no eval section; name one with --set eval.path=DIR "
            "(parquet shards) or --set eval.split=validation"
        )
    return cfg


@dataclass(frozen=True)
class _EvalInputs:
    cfg: dict
    checkpoint: str
    edges: list[int]
    eval_set: list = field(default_factory=list)  # [ObjectRef of the EvalSet]
    ranges: list = field(default_factory=list)  # the run's length ranges ([]: none)


def eval_loop(config: dict) -> None:
    """Ray Train's train_loop_per_worker for an evaluation: load the weights, evaluate this
    rank's share, report the all-reduced figures (the same on every rank)."""
    import ray
    import ray.train
    import ray.train.torch
    import torch

    from pipeline.data.evalset import rank_eval_batches
    from pipeline.learn.model_check import build_model_or_refuse
    from pipeline.train.evaluation import Evaluator

    inp = _EvalInputs(**config)
    cfg = RunConfig.model_validate(inp.cfg)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    model = build_model_or_refuse(cfg.model, max_positions=inp.edges[-1]).to(device)
    fs, path = filesystem_for(inp.checkpoint)
    with checkpoint_files(ray.train.Checkpoint(path, filesystem=fs), ["model.pt"]) as d:
        state = torch.load(f"{d}/model.pt", map_location=device, weights_only=True)
    model.load_state_dict(state)
    held_out = ray.get(inp.eval_set[0])
    batches = rank_eval_batches(cfg, held_out, top=inp.edges[-1], rank=rank, world_size=world)
    bf16 = cfg.train.bf16 == "on" or (cfg.train.bf16 == "auto" and device.type == "cuda")
    evaluator = Evaluator(
        cfg.eval, batches, edges=inp.edges, device=device, bf16=bf16, ranges=inp.ranges
    )
    metrics = evaluator.run(model)
    # Ray Train keeps the metrics of checkpointed reports only: rank 0 reports the figures with
    # a checkpoint holding them (beside the run: <run dir>/evaluate-<checkpoint>/).
    with tempfile.TemporaryDirectory(prefix="bucketray-eval-") as d:
        (Path(d) / EVAL_RESULT_FILE).write_text(json.dumps(metrics, indent=1))
        ckpt = ray.train.Checkpoint.from_directory(d) if rank == 0 else None
        ray.train.report(metrics, checkpoint=ckpt)


def evaluate_checkpoint(cfg: RunConfig, target: EvalTarget, *, log=print) -> dict:
    """The `eval/*` figures of the checkpoint `target` under `cfg` (Ray must be up)."""
    import ray
    import ray.train
    from ray.train.torch import TorchTrainer

    from pipeline.data.driver import find_run_data
    from pipeline.data.evalset import load_eval_set
    from pipeline.train.control import user_error

    data = find_run_data(cfg)  # the training data: the held-out set must not overlap it
    held_out = load_eval_set(cfg, data.index)
    log(f"[bucketray] {held_out.describe()}")
    s = cfg.scaling
    resources = {**s.resources_per_worker, "CPU": s.cpus_per_worker}
    if s.use_gpu:
        resources["GPU"] = 1
    inputs = _EvalInputs(
        cfg=cfg.model_dump(mode="json"),
        checkpoint=target.uri,
        edges=target.edges,
        eval_set=[ray.put(held_out)],
        ranges=checkpoint_ranges(target.uri),
    )
    storage, name = target.uri.rsplit("/", 1)  # the run's directory, the checkpoint's name
    fs, path = filesystem_for(storage)
    trainer = TorchTrainer(
        eval_loop,
        train_loop_config=dict(inputs.__dict__),
        scaling_config=ray.train.ScalingConfig(
            num_workers=s.num_workers, use_gpu=s.use_gpu, resources_per_worker=resources
        ),
        run_config=ray.train.RunConfig(
            name=f"evaluate-{name}-{uuid.uuid4().hex[:6]}",
            storage_path=path,
            storage_filesystem=fs if "://" in storage else None,
            failure_config=ray.train.FailureConfig(max_failures=0),
        ),
    )
    try:
        result = trainer.fit()
    except ray.train.TrainingFailedError as e:
        cause = user_error(e)
        if cause is None:
            raise
        raise cause from None
    return dict(result.metrics)


def checkpoint_ranges(uri: str) -> list[int]:
    """The length ranges the run of checkpoint `uri` reported its training loss by (recorded in
    its step history; [] for a bucketed run, or one recorded before ranges were), so that its
    held-out loss is split by the same ones."""
    from pipeline.train.history import read_history

    fs, path = filesystem_for(uri)
    return list(read_history(fs, path).range_edges)


def _evaluate_weights(
    cfg: RunConfig, state: dict, held_out, edges: list[int], device, ranges=()
) -> dict:
    """The `eval/*` figures of weights `state` on one process (no process group)."""
    from pipeline.data.evalset import rank_eval_batches
    from pipeline.learn.model_check import build_model_or_refuse
    from pipeline.train.evaluation import Evaluator

    model = build_model_or_refuse(cfg.model, max_positions=edges[-1]).to(device)
    model.load_state_dict(state)
    batches = rank_eval_batches(cfg, held_out, top=edges[-1], rank=0, world_size=1)
    bf16 = cfg.train.bf16 == "on" or (cfg.train.bf16 == "auto" and device.type == "cuda")
    evaluator = Evaluator(cfg.eval, batches, edges=edges, device=device, bf16=bf16, ranges=ranges)
    return evaluator.run(model)


def validate_checkpoint(
    checkpoint,
    *,
    step: int,
    epoch: int,
    eval_set: list,
    edges: list[int],
    run_dir: str,
    ranges=(),
) -> dict:
    """Ray Train's validation function (eval.mode=async): evaluate a reported checkpoint in a
    task of its own, on one process, and record the figures in `<run_dir>/evals/` (where the
    run's picture finds them; with the run's length ranges `ranges`) as well as returning them
    to Ray Train."""
    import time

    import ray
    import torch

    t0 = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with checkpoint_files(checkpoint, [RUN_CONFIG_FILE, "model.pt"]) as d:
        cfg = RunConfig.model_validate(json.loads((Path(d) / RUN_CONFIG_FILE).read_text()))
        state = torch.load(f"{d}/model.pt", map_location=device, weights_only=True)
    metrics = _evaluate_weights(cfg, state, ray.get(eval_set[0]), edges, device, ranges)
    metrics["eval/latency_s"] = time.perf_counter() - t0
    record = {"step": int(step), "epoch": int(epoch), **metrics}
    if ranges:
        record[ASYNC_RANGES_KEY] = [int(e) for e in ranges]
    fs, root = filesystem_for(run_dir)
    folder = f"{root.rstrip('/')}/{ASYNC_EVALS_DIR}"
    fs.create_dir(folder, recursive=True)
    with fs.open_output_stream(f"{folder}/step_{int(step):08d}.json") as f:
        f.write(json.dumps(record, indent=1).encode())
    from pipeline.train.evaluation import eval_line

    print(eval_line(int(step), int(epoch), metrics) + " (async)", flush=True)
    return metrics


def validation_resources(scaling) -> dict[str, float]:
    """What the eval.mode=async task asks Ray for (`ray_remote_kwargs`): one worker's CPUs and,
    with scaling.use_gpu, a whole GPU of its own (it loads the checkpoint's weights beside
    nothing else and evaluates on one process)."""
    out = {"num_cpus": float(scaling.cpus_per_worker)}
    if scaling.use_gpu:
        out["num_gpus"] = 1.0
    return out


def check_async_room(cluster, cfg: RunConfig, *, autoscaling: bool = False) -> None:
    """Refuse eval.mode=async, in one line naming eval.mode=inline, where its task cannot run
    beside the training workers in `cluster` (the resources it has, or at most can have).

    Why: Ray Train (2.60, `ValidationManager`) starts a validation task from its controller's
    loop, one at a time, with the resources above; the task waits for them, and at the run's
    end the controller shuts the worker group down first and drains the queued validations
    after (`TrainController._shutdown`). Workers holding every GPU (preflight lets them take
    all) therefore move every evaluation to after the last step. An autoscaling cluster may
    grow nodes for the task: not refused."""
    if cfg.eval is None or cfg.eval.mode != "async" or autoscaling:
        return
    s = cfg.scaling
    task = validation_resources(s)
    for name, key, per_worker in (
        ("CPU", "num_cpus", float(s.cpus_per_worker)),
        ("GPU", "num_gpus", 1.0 if s.use_gpu else 0.0),
    ):
        need = s.num_workers * per_worker + task.get(key, 0.0)
        have = float(cluster.get(name, 0.0))
        if key in task and need > have + 1e-9:
            raise ConfigError(
                f"eval.mode=async evaluates in a Ray task of its own ({task[key]:g} {name}) "
                f"beside {s.num_workers} training workers x {per_worker:g} {name}, but the "
                f"cluster has {have:g} {name}: Ray Train would start every evaluation only "
                "after the last training step. Set eval.mode=inline (every rank evaluates its "
                f"share between steps), or leave {task[key]:g} {name} free for it"
            )


def read_async_evals(fs, rdir: str, num_buckets: int):
    """The evaluations eval.mode=async recorded under a run directory, as an EvalHistory."""
    import pyarrow.fs as pafs

    from pipeline.train.history import EvalHistory

    out = EvalHistory()
    sel = pafs.FileSelector(f"{rdir.rstrip('/')}/{ASYNC_EVALS_DIR}", allow_not_found=True)
    for info in sorted(fs.get_file_info(sel), key=lambda i: i.base_name):
        if info.base_name.endswith(".json"):
            r = _read_json(fs, info.path)
            ranges = r.get(ASYNC_RANGES_KEY, ())
            out.append(r["step"], r["epoch"], r, num_buckets, r["eval/seconds"], ranges)
    return out
