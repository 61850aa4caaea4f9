"""Packed rows against padding, without training: the step kernel and the paper table.

    python -m bench.packed --out benchmarks/packed.json [--quick]

Two measurements in one process, no Ray (how packed rows train, and the held-out loss they
reach against padded batches at equal time, is `bench.outcome`'s question):

1. The step kernel (`measure_step_kernel`): forward + backward of the demo's model on the same
   documents, one torch thread, freed memory kept for reuse as in a training worker
   (`pipeline.data.rechunk.keep_freed_memory`): padded (sorted batches, each padded to its
   longest) against packed rows with the grouped per-document attention and with the
   block-mask reference; the median after a warm-up, the variants interleaved.
2. The on-paper table and the time to pack an epoch of the 902K preset (`bench.packing`).
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager

import numpy as np

from bench.common import DEMO_CONFIG, run_script, torch_threads
from bench.packing import packing_table
from bench.runs import load1
from bench.training import scaled_lengths
from pipeline.core.config import load_config

__all__ = ["ROW_LENGTHS", "main", "measure_step_kernel"]

# Packed rows hold this many longest samples: a sample that does not fit a row's rest opens a
# new row, so a row of one top edge leaves on average more of itself empty than a row of four
# (on the demo corpus, best-fit fills 0.985 of 512-token rows and 0.995 of 2048-token rows);
# attention stays within each document, so a longer row costs no more per token.
ROW_LENGTHS = 4


@contextmanager
def _one_thread_model(model_cfg, max_length: int):
    """(the model, whether freed memory is kept) for timing compute as a training worker runs
    it: one torch thread, freed memory kept for reuse (`keep_freed_memory`, which a worker's data
    stream sets); the thread count is restored after."""
    import torch

    from pipeline.data.rechunk import keep_freed_memory
    from pipeline.learn.factory import build_model

    with torch_threads(1):
        reused = keep_freed_memory()
        torch.manual_seed(0)
        yield build_model(model_cfg, max_length), reused


def _collate(values, offsets, samples, per_row, T, multiple=1):
    """The samples (indices into offsets), packed into rows of `per_row` samples each, or (None)
    one padded row per sample."""
    from pipeline.core.collate import collate
    from pipeline.core.packed_collate import collate_packed

    v = np.concatenate([values[offsets[i] : offsets[i + 1]] for i in samples])
    o = np.concatenate([[0], np.cumsum(offsets[samples + 1] - offsets[samples])])
    if per_row is None:
        return collate(v, o, upper=T, pad_to_multiple_of=multiple)
    return collate_packed(v, o, np.concatenate([[0], np.cumsum(per_row)]), row_tokens=T)


def measure_step_kernel(
    *, config: str = DEMO_CONFIG, tokens: int = 16384, repeats: int = 5, seed: int = 0
) -> dict:
    """Forward + backward of the config's model on the same ~`tokens` real tokens (lengths: the
    preset's distribution scaled to max_length), single-threaded; medians of `repeats` after one
    warm-up (module docstring)."""
    import torch
    import torch.nn.functional as F

    import pipeline.learn.model as model_module
    from pipeline.core.packing import best_fit_rows
    from pipeline.learn import packed_attention as pa

    cfg = load_config(config)
    T = cfg.data.max_length
    rng = np.random.default_rng(seed)
    pool = rng.permutation(scaled_lengths(max(4 * tokens // 64, 1000), T, seed))
    lens = pool[: int(np.searchsorted(np.cumsum(pool), tokens, side="right"))].astype(np.int64)
    real = int(lens.sum())
    values = rng.integers(3, cfg.model.vocab_size, real).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(lens)])

    # Micro-batches of at most `slots` = one row's padded tokens each: packed, one row of
    # R = ROW_LENGTHS longest samples (as the training runs pack); padded, the samples sorted by
    # length (sorted-static), each batch as many as fit padded.
    R = slots = ROW_LENGTHS * T
    row_of, closed = best_fit_rows(lens, R, 16)
    packed = []
    for row in closed:
        samples = np.flatnonzero(row_of == row)
        packed.append(_collate(values, offsets, samples, [samples.size], R))
    multiple = cfg.batching.pad_to_multiple_of
    padded, cur = [], []
    for i in np.argsort(lens, kind="stable"):
        width = -(-int(lens[i]) // multiple) * multiple
        if cur and (len(cur) + 1) * width > slots:
            padded.append(_collate(values, offsets, np.array(cur), None, T, multiple))
            cur = []
        cur.append(i)
    padded.append(_collate(values, offsets, np.array(cur), None, T, multiple))

    def tensors(b):
        return {k: torch.as_tensor(v) for k, v in b.items() if np.ndim(v) == 2}

    packed_t, padded_t = [tensors(b) for b in packed], [tensors(b) for b in padded]

    def step(batches):
        for b in batches:
            logits = model(b["input_ids"], b["attention_mask"], b["position_ids"])
            logits.float().logsumexp(-1).mean().backward()

    def mask_attention(qkv, docs, dropout_p=0.0):
        q, k, v = (x.transpose(1, 2) for x in qkv.unbind(2))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=pa.block_causal_mask(docs.doc))
        return out.transpose(1, 2)

    variants = {
        "padded": (lambda: step(padded_t), pa.document_attention_qkv),
        "packed": (lambda: step(packed_t), pa.document_attention_qkv),
        "packed_block_mask": (lambda: step(packed_t), mask_attention),
    }
    times: dict[str, list[float]] = {v: [] for v in variants}
    before = load1()
    with _one_thread_model(cfg.model, T) as (model, reused):
        try:
            for _ in range(repeats + 1):  # interleaved, so a slow phase hits every variant
                for name, (fn, attention) in variants.items():
                    model_module.document_attention_qkv = attention
                    t = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t)
        finally:
            model_module.document_attention_qkv = pa.document_attention_qkv
    med = {v: statistics.median(ts[1:]) for v, ts in times.items()}
    return {
        "config": config,
        "documents": int(lens.size),
        "real_tokens": real,
        "max_length": T,
        "row_tokens": R,
        "micro_batch_slots": slots,
        "packed_rows": int(closed.size),
        "packed_slots": int(closed.size) * R,
        "padded_batches": len(padded),
        "padded_slots": int(sum(b["input_ids"].size for b in padded)),
        "repeats": repeats,
        "seconds": med,
        "seconds_all": times,
        "real_tokens_per_s": {v: real / s for v, s in med.items()},
        "packed_vs_padded": med["padded"] / med["packed"],
        "block_mask_vs_padded": med["padded"] / med["packed_block_mask"],
        "load1": [before, load1()],
        "keep_freed_memory": reused,
    }


def measure(args, log) -> dict:
    """Both measurements of the module docstring (`--quick`: a smoke scale)."""
    from pipeline.core.synthetic import PRESETS, seed902k_lengths

    n = args.preset_samples or (50_000 if args.quick else PRESETS["seed902k"])
    log(f"the on-paper table and the time to pack an epoch of {n:,} samples")
    paper = packing_table(seed902k_lengths(n))
    log(f"packing {n:,} samples took {paper['pack_epoch_s']:.2f} s")
    log("forward + backward, padded against packed")
    kernel = measure_step_kernel(tokens=4096 if args.quick else 16384)
    log(f"step kernel packed / padded {kernel['packed_vs_padded']:.2f}x")
    return {"paper": paper, "kernel": kernel}


def main(argv: list[str] | None = None) -> dict:
    def add_args(p):
        p.add_argument("--preset-samples", type=int, help="paper table on this many (902,087)")

    return run_script("bench.packed", __doc__, measure, add_args, argv)


if __name__ == "__main__":
    main()
