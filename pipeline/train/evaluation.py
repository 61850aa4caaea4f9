"""One rank's held-out evaluations during a run (no Ray): the forward passes and the all-reduce.

The trainer asks `Evaluator.run(model)` at the points `eval:` names (`EvalConfig.due`), on every
rank at the same global step. Each rank evaluates its share of the held-out plan
(`pipeline.core.evaluation.eval_plan`) with `pipeline.learn.evaluate`, and one all-reduce adds
the sums of every rank, so every rank returns the same `eval/*` figures.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

import torch

from pipeline.core.evalconfig import EvalConfig
from pipeline.core.evaluation import EvalSums
from pipeline.data.tensors import batch_tensors
from pipeline.learn.evaluate import document_sums, no_side_effects
from pipeline.train.step import all_reduce

__all__ = ["EvalBatchesFn", "Evaluator", "eval_line", "evaluate_batches"]

EvalBatchesFn = Callable[[], Iterable]  # this rank's held-out micro-batches, afresh on each call


def evaluate_batches(
    model: torch.nn.Module,
    batches: Iterable,
    *,
    edges,
    device: torch.device,
    bf16: bool = False,
    ranges=(),
) -> EvalSums:
    """This rank's sums over `batches` (MicroBatch objects), by the training buckets `edges`
    and, where the run has them, by its length ranges `ranges`."""
    total = EvalSums.zeros(len(edges) - 1, ranges)
    with no_side_effects(model, device):
        for mb in batches:
            if mb.input_ids.numel() == 0:
                continue  # this rank has nothing at this step of the held-out plan
            x = batch_tensors(mb, device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(x["input_ids"], x["attention_mask"], x["position_ids"])
            loss, correct, tokens, length = document_sums(logits, x["labels"], x["attention_mask"])
            total = total + EvalSums.of_documents(loss, correct, tokens, length, edges, ranges)
    return total


class Evaluator:
    """Evaluates a model on this rank's held-out micro-batches and all-reduces the sums. With
    `ranges` (the length ranges the run's training loss is reported by, `RunSpec.ranges`; []
    for a bucketed run, whose buckets are its length ranges) the held-out loss is split by them
    too, in the same vector."""

    def __init__(
        self,
        cfg: EvalConfig,
        batches: EvalBatchesFn,
        *,
        edges,
        device: torch.device,
        bf16: bool = False,
        ranges=(),
    ):
        self.cfg, self.batches, self.edges = cfg, batches, [int(e) for e in edges]
        self.device, self.bf16 = device, bf16
        self.ranges = [int(e) for e in ranges]

    @property
    def num_buckets(self) -> int:
        return len(self.edges) - 1

    def run(self, model: torch.nn.Module) -> dict[str, float]:
        """The `eval/*` figures of `model` over the whole held-out set (every rank's share),
        plus `eval/seconds`; the same on every rank."""
        t0 = time.perf_counter()
        local = evaluate_batches(
            model,
            self.batches(),
            edges=self.edges,
            device=self.device,
            bf16=self.bf16,
            ranges=self.ranges,
        )
        v = torch.from_numpy(local.vector()).to(self.device)
        total = EvalSums.from_vector(all_reduce(v).cpu().numpy(), self.num_buckets, self.ranges)
        return {**total.metrics(), "eval/seconds": time.perf_counter() - t0}


def eval_line(step: int, epoch: int, m: dict[str, float]) -> str:
    """Rank 0's console line for one evaluation; a run with one bucket adds each length range's
    held-out loss (`eval/loss_by_length/<lo>-<hi>`, "-" where the range had no token)."""
    line = (
        f"[bucketray] eval at step {step} (epoch {epoch}): held-out loss {m['eval/loss']:.4f} "
        f"(per sample {m['eval/loss_per_sample']:.4f}), accuracy {m['eval/accuracy']:.3f} | "
        f"{int(m['eval/samples']):,} samples, {int(m['eval/tokens']):,} tokens in "
        f"{m['eval/seconds']:.1f} s"
    )
    prefix = "eval/loss_by_length/"
    ranges = [(k[len(prefix) :], v) for k, v in m.items() if k.startswith(prefix)]
    if ranges:
        by = ", ".join(f"{r} {v:.3f}" if math.isfinite(v) else f"{r} -" for r, v in ranges)
        line += f" | by length (tokens): {by}"
    return line
