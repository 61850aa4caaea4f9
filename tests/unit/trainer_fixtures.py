"""A Trainer on one process without Ray: tiny config, synthetic micro-batches, a folder of
checkpoints. Shared by the trainer tests (also spawned into gloo worker processes)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch

from pipeline.core.collate import collate
from pipeline.core.config import RunConfig
from pipeline.data.rechunk import MicroBatch
from pipeline.learn.checkpoint import load_checkpoint
from pipeline.train.history import EvalHistory, StepHistory
from pipeline.train.runspec import RunSpec
from pipeline.train.trainer import Trainer

STEPS = 6  # global steps per epoch; bucket = step % 2
EDGES = [0, 16, 32]


def config(tmp: Path, *, eval: dict | None = None, model: dict | None = None, **train):
    return RunConfig.model_validate(
        {
            "data": {"synthetic": {}},
            "model": {
                "vocab_size": 32,
                "d_model": 16,
                "n_layers": 1,
                "n_heads": 2,
                "d_ff": 32,
                **(model or {}),
            },
            "train": {"epochs": 2, "lr": 1e-2, "warmup_steps": 2, "log_every": 1, **train},
            "checkpoint": {"storage_path": str(tmp / "runs"), "every_steps": 3},
            "wandb": {"mode": "disabled", "dir": str(tmp / "wandb")},
            "eval": eval,
        }
    )


def spec(tmp: Path, rank: int = 0, world: int = 1, planned=(STEPS, STEPS)) -> RunSpec:
    return RunSpec(
        rank=rank,
        world=world,
        device=torch.device("cpu"),
        edges=EDGES,
        steps_per_epoch=list(planned),
        epochs=[{"hash": f"h{e}", "metrics": {"epoch/steps": n}} for e, n in enumerate(planned)],
        run_dir=str(tmp / "runs" / "run"),
    )


def micro_batch(epoch: int, step: int, rank: int = 0) -> MicroBatch:
    """Deterministic rows per (epoch, step, rank); bucket 0 short rows, bucket 1 long ones."""
    bucket = step % 2
    rng = np.random.default_rng((epoch, step, rank))
    lo, hi = (3, 16) if bucket == 0 else (17, 32)
    rows = [rng.integers(0, 32, rng.integers(lo, hi)) for _ in range(3)]
    lens = [len(r) for r in rows]
    out = collate(np.concatenate(rows), np.concatenate([[0], np.cumsum(lens)]), upper=32)
    t = {k: torch.from_numpy(np.asarray(v)) for k, v in out.items()}
    ids = np.arange(3) + 100 * step + 10 * rank + 1000 * epoch
    return MicroBatch(
        epoch,
        step,
        bucket,
        ids,
        t["input_ids"],
        t["attention_mask"],
        t["labels"],
        t["position_ids"],
        int(out["num_real_tokens"]),
        int(out["num_padded_tokens"]),
    )


def batches_for(rank: int = 0, planned=(STEPS, STEPS)):
    def batches(epoch: int, start: int):
        return (micro_batch(epoch, s, rank) for s in range(start, planned[epoch]))

    return batches


class Saver:
    """Copies each reported checkpoint to <root>/<name>, as Ray Train's storage would."""

    def __init__(self, root: Path):
        self.root = root
        self.reports: list[tuple[str, dict]] = []
        self.validations: list[tuple[str, dict]] = []  # eval.mode=async: what Ray would evaluate

    def __call__(self, directory: str, metrics: dict, name: str, validation=None) -> None:
        shutil.copytree(directory, self.root / name, dirs_exist_ok=True)
        self.reports.append((name, metrics))
        if validation is not None:
            self.validations.append((name, validation))

    def latest(self, rank: int = 0):
        names = sorted(p for p in self.root.glob("checkpoint_step*"))
        return load_checkpoint(names[-1], rank=rank) if names else None

    def latest_history(self) -> StepHistory | None:
        names = sorted(p for p in self.root.glob("checkpoint_step*"))
        return StepHistory.read_dir(str(names[-1])) if names else None

    def latest_evals(self) -> EvalHistory | None:
        names = sorted(p for p in self.root.glob("checkpoint_step*"))
        return EvalHistory.read_dir(str(names[-1])) if names else None


def held_out_batches(n: int = 3):
    """A fixed held-out set: the same `n` micro-batches on every call."""
    return lambda: [micro_batch(9, s) for s in range(n)]


def trainer(
    tmp: Path, cfg: RunConfig, saver: Saver, rank=0, world=1, planned=(STEPS, STEPS), **kw
) -> Trainer:
    t = Trainer(cfg, spec(tmp, rank, world, planned), save=saver, **kw)
    t.resume(saver.latest(rank), saver.latest_history(), saver.latest_evals())
    return t


def model_with_an_unused_layer(config: dict) -> torch.nn.Module:
    """A `package.module:factory` model: an embedding and a head, plus a layer no step uses."""

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(config["vocab_size"], 8)
            self.head = torch.nn.Linear(8, config["vocab_size"])
            self.unused = torch.nn.Linear(8, 8)

        def forward(self, input_ids, attention_mask, position_ids):
            return self.head(self.embed(input_ids))

    return Model()
