"""The GPU step benchmark: what a training step costs on one GPU, per batching policy, at a
realistic size. Runs without Ray, in one process, on whatever device torch sees.

The lengths are the seed902k preset's (902,087 samples up to 8,192 tokens; token values are
random: the step's cost depends on the lengths only). Each policy plans its epoch 0 with the real
planner, its micro-batches are collated by the real re-chunker (`pipeline.data.rechunk.deliver`)
from rows held in memory, and trained by the real step (`pipeline.train.step.train_group`, then
clipping and AdamW as the `Trainer` does), each policy at the same real tokens per step:

- `packed`: rows of `row_tokens` holding whole samples, per-document attention;
- `auto`: padded batches over auto-edge buckets, token budget sized to the packed step's real
  tokens;
- `sorted`: sorted-static (one bucket, samples in length order, the same budget rule);
- `random`: one bucket, samples in random order (the same budget rule).

Measured per model and policy, on `steps` micro-batches spread over the epoch, the policies
taking turns `rounds` times: real tokens/s, MFU (model FLOPs of the real tokens: 6 x parameters
x tokens + 6 x layers x width x the sum of squared document lengths, over the GPU's dense bf16
peak), peak memory, the share of step time the training thread waited for its next micro-batch
(collated in a background thread while the GPU computes), and the host-device synchronisations
of one optimizer step (torch.cuda.set_sync_debug_mode).

    python -m bench.gpu --out benchmarks/gpu.json            # on a GPU: ~1B Llama, scaled demo
    python -m bench.gpu --tiny --out out/gpu-tiny.json       # CPU-sized smoke of the same code
"""

from __future__ import annotations

import argparse
import contextlib
import time
import warnings
from types import SimpleNamespace

import numpy as np
import pyarrow as pa

from bench.common import run_script
from pipeline.core.config import RunConfig
from pipeline.core.epochs import epoch_plan_for, resolve_edges
from pipeline.core.synthetic import seed902k_lengths

__all__ = ["MODELS", "POLICIES", "main", "model_flops", "policy_config"]

# Dense bf16 peak of the GPUs this is run on (NVIDIA's datasheets, without sparsity).
PEAK_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0}
# A ~1B Llama-style model (TinyLlama's shape) and the demo's decoder scaled to about the same.
MODELS = {
    "llama_1b": {
        "name": "hf_causal_lm",
        "vocab_size": 32000,
        "hf_config": {
            "model_type": "llama",
            "hidden_size": 2048,
            "intermediate_size": 5632,
            "num_hidden_layers": 22,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "max_position_embeddings": 8192,
            "tie_word_embeddings": False,
        },
    },
    "tiny_decoder_1b": {
        "name": "tiny_decoder",
        "vocab_size": 32000,
        "d_model": 2048,
        "n_layers": 16,
        "n_heads": 16,
        "d_ff": 8192,
    },
}
TINY_MODELS = {
    "llama_1b": {
        "name": "hf_causal_lm",
        "vocab_size": 512,
        "hf_config": {
            "model_type": "llama",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 512,
        },
    },
    "tiny_decoder_1b": {
        "name": "tiny_decoder",
        "vocab_size": 512,
        "d_model": 64,
        "n_layers": 2,
        "n_heads": 4,
        "d_ff": 128,
    },
}
POLICIES = ("packed", "auto", "sorted", "random")


def policy_config(policy: str, model: dict, *, top: int, step_tokens: int) -> RunConfig:
    """The run config of `policy` at `step_tokens` tokens per step (packed: rows of `top`
    tokens; the padded policies' budget is re-sized to equal real tokens in `plans`)."""
    if policy == "packed":
        batching = {"mode": "packed", "row_tokens": top, "rows_per_step": step_tokens // top}
        buckets, plan = {"num_buckets": "auto"}, "bucketed"
    else:
        batching = {"mode": "token_budget", "token_budget": step_tokens}
        buckets = {"num_buckets": "auto"} if policy == "auto" else {"edges": [0, top]}
        plan = "bucketed" if policy == "auto" else policy
    return RunConfig.model_validate(
        {
            "data": {"synthetic": {"preset": "seed902k"}, "max_length": top},
            "batching": batching,
            "buckets": buckets,
            "plan": {"policy": plan, "seed": 0},
            "model": model,
            "train": {"bf16": "on", "lr": 3e-4},
            "wandb": {"mode": "disabled"},
        }
    )


def _plan(cfg: RunConfig, lengths: np.ndarray):
    edges = [int(e) for e in resolve_edges(cfg, lengths)]
    index = SimpleNamespace(lengths=lengths, sample_ids=np.arange(lengths.size, dtype=np.int64))
    return edges, epoch_plan_for(cfg, index, edges, 0, 1)


def plans(model: dict, lengths: np.ndarray, *, top: int, step_tokens: int) -> dict:
    """Every policy's config, edges and epoch-0 plan; the padded policies' token budget set so
    that their mean real tokens per step equal the packed plan's."""
    out = {}
    for policy in POLICIES:
        cfg = policy_config(policy, model, top=top, step_tokens=step_tokens)
        edges, plan = _plan(cfg, lengths)
        if policy != "packed":
            # real tokens per step scale with the budget; the packed plan's are the target
            real, target = (
                lengths.sum() / plan.num_steps,
                lengths.sum() / out["packed"][2].num_steps,
            )
            budget = max(top, int(step_tokens * target / real))
            cfg = cfg.model_copy(
                update={"batching": cfg.batching.model_copy(update={"token_budget": budget})}
            )
            edges, plan = _plan(cfg, lengths)
        out[policy] = (cfg, edges, plan)
    return out


def micro_batches(cfg: RunConfig, plan, lengths: np.ndarray, steps: int, vocab: int, seed: int = 0):
    """`steps` of the plan's micro-batches spread over the epoch, as a generator that collates
    each one when asked (the real re-chunker, from rows held in memory)."""
    from pipeline.data.rechunk import deliver

    every = max(1, plan.num_steps // steps)
    picks = [s * every for s in range(min(steps, plan.num_steps))]
    rng = np.random.default_rng(seed)  # token values: a step's cost depends on lengths only
    parts = []
    for s in picks:
        view = plan.slice(s, s + 1).rank_view(0)
        ids = np.asarray(view.sample_ids, dtype=np.int64)
        n = lengths[ids]
        values = rng.integers(1, vocab, int(n.sum()), dtype=np.int32)
        offsets = np.concatenate([[0], np.cumsum(n)]).astype(np.int64)
        table = pa.table(
            {
                "sample_id": pa.array(ids),
                "input_ids": pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values)),
            }
        )
        parts.append((view, table))

    def generate():
        for view, table in parts:
            yield from deliver(view, [table], epoch=0, pad_to_multiple_of=8, pin_memory=True)

    return generate


def model_flops(params: int, layers: int, width: int, real: int, squares: int) -> float:
    """Training FLOPs of a step's real tokens: 6 per parameter and token (forward and backward
    of every matrix), and causal attention's 6 x width x L^2 per layer and document of L
    tokens (QK^T and AV, halved by causality, times three for the backward)."""
    return 6.0 * params * real + 6.0 * layers * width * squares


def _squares(mb) -> int:
    """Sum of squared document lengths of a micro-batch, from its host tensors: packed rows
    number their documents per row (int32), padded batches hold one sample per row (0/1)."""
    mask = mb.attention_mask.numpy()
    if mask.size == 0:
        return 0
    if mask.dtype != np.int32:
        n = mask.sum(axis=1).astype(np.float64)
        return int((n * n).sum())
    key = (np.arange(mask.shape[0])[:, None] * (int(mask.max()) + 1) + mask)[mask > 0]
    counts = np.unique(key, return_counts=True)[1].astype(np.float64)
    return int((counts * counts).sum())


class Prefetch:
    """The trainer's prefetcher (`pipeline.train.prefetch`: collation, pinning and, on CUDA, the
    copy to the device on a thread of their own, ahead of the step); `wait_s` is the time the
    training thread spent blocked waiting for a micro-batch."""

    def __init__(self, source, device):
        from pipeline.train.prefetch import prefetch_batches

        self._it = prefetch_batches(source, device=device, ahead=2)
        self.wait_s = 0.0

    def __iter__(self):
        with self._it:
            while True:
                t0 = time.perf_counter()
                try:
                    item = next(self._it)
                except StopIteration:
                    return
                finally:
                    self.wait_s += time.perf_counter() - t0
                yield item


def _matmul_params(model) -> int:
    """Parameters that multiply every token (the 6N of the FLOPs): all but lookup tables (an
    input embedding not tied to the output head, learned positions)."""
    from pipeline.learn.model import count_parameters

    n = count_parameters(model)
    hf = getattr(model, "hf", None)
    if hf is not None:
        emb, head = hf.get_input_embeddings(), hf.get_output_embeddings()
        tied = head is not None and head.weight is emb.weight
        return n - (0 if tied else emb.weight.numel())
    pos = getattr(model, "pos", None)
    return n - (pos.weight.numel() if pos is not None else 0)


def _shape(model) -> tuple[int, int]:
    """(layers, attention width) of the model, for the attention FLOPs."""
    hf = getattr(model, "hf", None)
    if hf is not None:
        c = hf.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return c.num_hidden_layers, c.num_attention_heads * head_dim
    return len(model.blocks), model.tok.weight.shape[1]


def _sync_points(step, batches) -> float:
    """Host-device synchronisations per optimizer step, as torch's sync debug mode reports them
    (CUDA only; None elsewhere)."""
    import torch

    if not torch.cuda.is_available():
        return None
    n = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for mb in batches:
                step(mb)
                n += 1
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    return len(syncs) / max(n, 1)


def _timed_rounds(step, gens: dict, out: dict, rounds: int, device) -> None:
    """Every policy's micro-batches, collated in a background thread, the policies taking turns
    `rounds` times; per policy its seconds, data waits, tokens and peak memory into `out`."""
    import torch

    cuda = device.type == "cuda"
    names = [p for p in gens if "error" not in out[p]]
    for r in range(rounds):
        for p in names[r % len(names) :] + names[: r % len(names)]:
            feed = Prefetch(gens[p](), device)
            time.sleep(0.5 if cuda else 0.05)  # the first batches ready: a primed pipeline
            feed.wait_s = 0.0
            if cuda:
                torch.cuda.reset_peak_memory_stats()
                torch.cuda.synchronize()
            t = time.perf_counter()
            real = slots = squares = 0
            for mb in feed:
                step(mb)
                real += mb.num_real_tokens
                slots += mb.num_padded_tokens
                squares += _squares(mb)
            if cuda:
                torch.cuda.synchronize()
            o = out[p]
            o["rounds_s"].append(time.perf_counter() - t)
            o["wait_s"].append(feed.wait_s)
            o["real"], o["slots"], o["squares"] = real, slots, squares
            if cuda:
                o["peak"] = max(o["peak"], torch.cuda.max_memory_allocated())


def _row(o: dict, steps: int, flops: float, peak_tflops: float | None) -> dict:
    """A policy's figures from its rounds (the median round)."""
    s = float(np.median(o["rounds_s"]))
    return {
        "steps": steps,
        "real_tokens_per_step": o["real"] / steps,
        "fill": o["real"] / max(o["slots"], 1),
        "step_s": s / steps,
        "real_tokens_per_s": o["real"] / s,
        "tflops": flops / s / 1e12,
        "mfu": flops / s / 1e12 / peak_tflops if peak_tflops else None,
        "wait_fraction": float(np.sum(o["wait_s"]) / np.sum(o["rounds_s"])),
        "peak_memory_gib": o["peak"] / 2**30 if o["peak"] else None,
        "rounds_s": o["rounds_s"],
    }


def measure_model(name: str, model_cfg: dict, lengths: np.ndarray, args, log) -> dict:
    """One model: every policy's steps, the policies taking turns (module docstring)."""
    import torch

    from pipeline.learn.factory import build_model
    from pipeline.learn.optim import build_optimizer
    from pipeline.learn.packed_attention import require_packed_support
    from pipeline.train.step import train_group

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    top, vocab = args.top, model_cfg["vocab_size"]
    t0 = time.perf_counter()
    planned = plans(model_cfg, lengths, top=top, step_tokens=args.step_tokens)
    log(f"{name}: planned {len(planned)} policies in {time.perf_counter() - t0:.1f} s")
    cfg = planned["packed"][0]
    torch.manual_seed(0)
    with device:
        model = build_model(cfg.model, max_positions=top)
    model = model.to(device)
    require_packed_support(model)
    opt = build_optimizer(model, cfg.train)
    params_ = [p for p in model.parameters() if p.requires_grad]
    layers, width = _shape(model)
    params = _matmul_params(model)
    log(f"{name}: {params / 1e9:.2f}B matmul parameters, {layers} layers, width {width}")

    def step(mb) -> None:
        # as the Trainer steps: clipping inside the step, its norm read with the step's figures
        train_group(model, [mb], device=device, world_size=1, bf16=cuda, clip=(params_, 1.0))
        opt.step()
        opt.zero_grad(set_to_none=True)

    gens = {
        p: micro_batches(c, plan, lengths, args.steps, vocab) for p, (c, _, plan) in planned.items()
    }
    out = {p: {"rounds_s": [], "wait_s": [], "real": 0, "slots": 0, "squares": 0, "peak": 0}
           for p in planned}  # fmt: skip
    for p, gen in gens.items():  # warm-up: kernels chosen, allocator grown, once per policy
        try:
            for mb in list(gen())[: args.warmup]:
                step(mb)
        except torch.OutOfMemoryError as e:
            out[p]["error"] = f"out of memory: {str(e).splitlines()[0]}"
            opt.zero_grad(set_to_none=True)
    _timed_rounds(step, gens, out, args.rounds, device)
    result = {"params": params, "layers": layers, "width": width, "policies": {}}
    for p, o in out.items():
        _, edges, plan = planned[p]
        row = {"buckets": len(edges) - 1, "steps_per_epoch": int(plan.num_steps)}
        if "error" in o:
            result["policies"][p] = row | {"error": o["error"]}
            continue
        row |= _row(o, args.steps, model_flops(params, layers, width, o["real"], o["squares"]),
                    _peak_tflops(device))  # fmt: skip
        row["syncs_per_step"] = _sync_points(step, list(gens[p]())[:2])
        result["policies"][p] = row
        log(f"{name} {p}: {row['real_tokens_per_s'] / 1e3:.1f} Ktok/s, fill {row['fill']:.3f}, "
            f"MFU {row['mfu'] or 0:.1%}, wait {row['wait_fraction']:.1%}, "
            f"syncs/step {row['syncs_per_step']}")  # fmt: skip
    pol = result["policies"]
    rate = {p: v.get("real_tokens_per_s") for p, v in pol.items()}
    if rate.get("packed"):
        result["packed_vs"] = {
            p: rate["packed"] / v for p, v in rate.items() if v and p != "packed"
        }
    if cuda:
        model.to("cpu")  # the next model gets the whole GPU
        opt.state.clear()
        torch.cuda.empty_cache()
    return result


def _peak_tflops(device) -> float | None:
    import torch

    if device.type != "cuda":
        return None
    gpu = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_TFLOPS.items() if k in gpu), None)


def _versions() -> dict:
    import torch
    import transformers

    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "peak_bf16_tflops": _peak_tflops(torch.device("cuda"))
        if torch.cuda.is_available()
        else None,
    }


def measure(args, log) -> dict:
    lengths = seed902k_lengths(args.samples)
    if args.tiny:  # the preset's shape at a 16th of its lengths: CPU-sized steps
        lengths = np.maximum(lengths // 16, 1)
    lengths = np.minimum(lengths, args.top)
    models = TINY_MODELS if args.tiny else MODELS
    chosen = args.models.split(",") if args.models else list(models)
    out = {
        "versions": _versions(),
        "setup": {
            "samples": int(lengths.size),
            "top": args.top,
            "step_tokens": args.step_tokens,
            "steps": args.steps,
            "rounds": args.rounds,
            "warmup": args.warmup,
            "tiny": args.tiny,
        },
        "models": {},
    }
    for name in chosen:
        out["models"][name] = measure_model(name, models[name], lengths, args, log)
    return out


def _add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tiny", action="store_true", help="CPU-sized models and lengths (a smoke)")
    p.add_argument("--models", default=None, help=f"comma-separated, of {sorted(MODELS)}")
    p.add_argument("--samples", type=int, default=None, help="preset samples (default all)")
    p.add_argument("--top", type=int, default=None, help="longest sample (default 8192)")
    p.add_argument("--step-tokens", type=int, default=None, help="tokens per step (16384)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per round (6)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)


def main(argv: list[str] | None = None) -> dict:
    def run(args, log):
        tiny = args.tiny
        args.samples = args.samples or (4000 if tiny else 902_087)
        args.top = args.top or (512 if tiny else 8192)
        args.step_tokens = args.step_tokens or (1024 if tiny else 16384)
        args.steps = args.steps or (3 if tiny else 6)
        return measure(args, log)

    return run_script("bench.gpu", __doc__, run, _add_args, argv)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
