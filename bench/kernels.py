"""Compute micro-benchmarks of packed rows against padding, one thread, no Ray (items 2 and 3 of
`bench.packed_training`, which runs them):

- the step kernel (`measure_step_kernel`): forward + backward of the same model on the same
  documents, padded (sorted batches, each padded to its longest) against packed rows with the
  grouped per-document attention and with the block-mask reference;
- the training plans' compute (`measure_plan_kernel`): forward + backward + the training loss on
  the very micro-batches a run feeds one rank in epoch 0 of each variant's plan, the variants
  taking turns micro-batch by micro-batch.

Both time the model as a training worker runs it: one torch thread, freed memory kept for reuse
(`pipeline.data.rechunk.keep_freed_memory`).
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager

import numpy as np

from bench.runs import load1
from bench.training import scaled_lengths
from pipeline.core.config import load_config

__all__ = ["DEMO_CONFIG", "ROW_LENGTHS", "measure_plan_kernel", "measure_step_kernel"]

DEMO_CONFIG = "configs/local.yaml"
# Packed rows hold this many longest samples: a sample that does not fit a row's rest opens a
# new row, so a row of one top edge leaves on average more of itself empty than a row of four
# (on the demo corpus, best-fit fills 0.985 of 512-token rows and 0.995 of 2048-token rows);
# attention stays within each document, so a longer row costs no more per token.
ROW_LENGTHS = 4


def _tiny_model(model_cfg, max_length: int):
    import torch

    from pipeline.learn.factory import build_model

    torch.manual_seed(0)
    return build_model(model_cfg, max_length)


@contextmanager
def _one_thread_model(model_cfg, max_length: int):
    """(the model, whether freed memory is kept) for timing compute as a training worker runs
    it: one torch thread, freed memory kept for reuse (`keep_freed_memory`, which a worker's data
    stream sets); the thread count is restored after."""
    import torch

    from pipeline.data.rechunk import keep_freed_memory

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        reused = keep_freed_memory()
        yield _tiny_model(model_cfg, max_length), reused
    finally:
        torch.set_num_threads(threads)


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

    # Micro-batches of at most `slots` padded tokens each: packed, one row of R = ROW_LENGTHS
    # longest samples (as the training runs pack); padded, the samples sorted by length
    # (sorted-static), each batch as many as fit padded.
    R = ROW_LENGTHS * T
    slots = R
    row_of, closed = best_fit_rows(lens, R, 16)
    packed = []
    for rows in np.array_split(closed, -(-closed.size // (slots // R))):
        samples = [np.flatnonzero(row_of == r) for r in rows]
        packed.append(
            _collate(values, offsets, np.concatenate(samples), [len(x) for x in samples], R)
        )
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


def _plan_micro_batches(cfg, lengths, sample_ids, *, rank: int, every: int, rng) -> dict:
    """Every `every`-th non-empty micro-batch of `rank` in epoch 0 of `cfg`'s plan over these
    lengths, collated as the data stream collates it (`pipeline.data.rechunk.collate_micro_batch`),
    with random token ids of the same lengths."""
    import types

    import torch

    from pipeline.core.epochs import epoch_plan_for, resolve_edges
    from pipeline.data.rechunk import TENSOR_KEYS, collate_micro_batch

    edges = resolve_edges(cfg, lengths)
    index = types.SimpleNamespace(lengths=lengths, sample_ids=sample_ids)
    plan = epoch_plan_for(cfg, index, edges, 0, cfg.scaling.num_workers)
    view = plan.rank_view(rank)
    o = view.offsets
    nonempty = np.flatnonzero(np.diff(o) > 0)
    batches, reals, slots = [], [], 0
    for m in nonempty[::every]:
        a, b = int(o[m]), int(o[m + 1])
        lens = view.lengths[a:b].astype(np.int64)
        vals = rng.integers(3, cfg.model.vocab_size, int(lens.sum())).astype(np.int32)
        out = collate_micro_batch(
            view, m, vals, lens, pad_to_multiple_of=cfg.batching.pad_to_multiple_of
        )
        batches.append({k: torch.from_numpy(out[k]) for k in TENSOR_KEYS})
        reals.append(int(lens.sum()))
        slots += int(out["input_ids"].size)
    return {
        "batches": batches,
        "real": reals,
        "steps": plan.num_steps,
        "micro_batches": len(batches),
        "real_tokens": sum(reals),
        "slots": slots,
        "num_buckets": len(edges) - 1,
    }


def measure_plan_kernel(
    lengths: np.ndarray,
    sample_ids: np.ndarray,
    configs: dict,
    *,
    every: int = 4,
    blocks: int = 4,
    rank: int = 0,
    seed: int = 0,
) -> dict:
    """Forward + backward + the training loss of one model, single-threaded, on the micro-batches
    the training runs feed rank `rank` in epoch 0 of each config's plan (`configs`: variant ->
    RunConfig) over the same corpus lengths: every `every`-th micro-batch, so a sorted epoch's
    short and long steps are both in. The variants take turns micro-batch by micro-batch, so a
    slow phase of a shared machine falls on every variant alike. The spread: `blocks` strided
    subsets (block b of a variant: its micro-batches b, b + blocks, ...) each give their own
    ratio to sorted-static.
    This is the compute the batching changes, without Ray, the other rank, the optimizer or
    the data stream: a precise ratio where a whole training run's is noisy."""
    from pipeline.learn.loss import token_sums

    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths, dtype=np.int64)
    made = {
        v: _plan_micro_batches(c, lengths, sample_ids, rank=rank, every=every, rng=rng)
        for v, c in configs.items()
    }
    first = next(iter(configs.values()))

    def train_on(batches) -> float:
        t = time.perf_counter()
        for b in batches:
            logits = model(b["input_ids"], b["attention_mask"], b["position_ids"])
            loss, _ = token_sums(logits, b["labels"])
            loss.backward()
            model.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    names = list(made)
    # Each micro-batch timed on its own, the variants' micro-batches interleaved in proportion
    # (each advances through its epoch at the same pace), so a slow second of a shared machine
    # falls on every variant alike.
    turns = sorted(
        ((i + 0.5) / len(made[v]["batches"]), k, v, i)
        for k, v in enumerate(names)
        for i in range(len(made[v]["batches"]))
    )
    secs = {v: np.zeros(len(made[v]["batches"])) for v in names}
    before = load1()
    with _one_thread_model(first.model, first.data.max_length) as (model, reused):
        for v in names:  # warm-up: one micro-batch each
            train_on(made[v]["batches"][:1])
        for _, _, v, i in turns:
            secs[v][i] = train_on(made[v]["batches"][i : i + 1])
    secs = {v: [float(x[b::blocks].sum()) for b in range(blocks)] for v, x in secs.items()}
    toks = {v: [sum(made[v]["real"][b::blocks]) for b in range(blocks)] for v in names}
    ref = "sorted" if "sorted" in names else names[0]
    out = {}

    def rates(v):
        return [t / s if s > 0 else float("nan") for t, s in zip(toks[v], secs[v], strict=True)]

    for v in names:
        ratios = [a / r for a, r in zip(rates(v), rates(ref), strict=True)]
        m = made[v]
        out[v] = {
            **{k: m[k] for k in ("steps", "micro_batches", "real_tokens", "slots", "num_buckets")},
            "token_efficiency": m["real_tokens"] / max(m["slots"], 1),
            "seconds": sum(secs[v]),
            "real_tokens_per_s": m["real_tokens"] / max(sum(secs[v]), 1e-9),
            "vs_sorted_blocks": [x for x in ratios if np.isfinite(x)],
        }
    for v in names:
        out[v]["vs_sorted"] = out[v]["real_tokens_per_s"] / out[ref]["real_tokens_per_s"]
    return {
        "samples": int(lengths.size),
        "rank": rank,
        "world_size": first.scaling.num_workers,
        "every": every,
        "blocks": blocks,
        "variants": out,
        "load1": [before, load1()],
        "keep_freed_memory": reused,
    }
