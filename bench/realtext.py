"""Training signal on real text: loss readability and per-bucket loss curves on the stdlib corpus.

The synthetic corpus is equally predictable at every length, so its buckets have no loss offset
and `train/loss_debiased` has nothing to remove. Here the tiny decoder trains on the `pystdlib`
corpus (this Python's standard library split into functions, byte tokens; see
pipeline/data/textcorpus.py), where a bucket's loss depends on its lengths, through the real
`pipeline.train.launch.run` with optimal bucket edges, padded batches of the config's own step tokens (the
batches `make demo` trains on) and one metrics line per step. Reported:

- loss readability: the variance of the step-to-step change of `train/loss` and of
  `train/loss_debiased` over the same steps (`quality.loss_readability`), and their ratio;
- each bucket's own curve: the raw step loss at exactly the steps that trained that bucket
  (no running estimate), plus each bucket's mean loss over the second half of the run and its
  correlation with the bucket index.

Part of `python -m bench.training`, whose JSON holds it under `training.realtext`.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np

from bench.common import config_step_tokens
from bench.quality import loss_readability
from bench.runs import read_metric_lines, run_overrides, run_summary, timed_run
from pipeline.core.config import load_config
from pipeline.data.textcorpus import BYTE_VOCAB, write_text_corpus

__all__ = ["bucket_curves", "measure_realtext", "realtext_overrides"]


def bucket_curves(curves: dict) -> dict[int, list[tuple[int, float]]]:
    """bucket -> [(step, raw loss)] at the steps that trained that bucket."""
    out: dict[int, list[tuple[int, float]]] = {}
    for (step, loss), b in zip(curves["loss"], curves["bucket"], strict=True):
        out.setdefault(int(b), []).append((int(step), float(loss)))
    return dict(sorted(out.items()))


def _bucket_means(per_bucket: dict, from_step: int) -> dict[int, float]:
    means = {}
    for b, pts in per_bucket.items():
        late = [v for s, v in pts if s >= from_step]
        if late:
            means[b] = float(np.mean(late))
    return means


def realtext_overrides(
    work: Path,
    corpus_dir: str,
    name: str,
    *,
    max_length: int,
    max_steps: int | None,
    token_budget: int,
    seed: int = 0,
) -> list[str]:
    """The config overrides of the real-text run: the corpus, optimal edges, padded batches of
    `token_budget` tokens, one metrics line per step in `work/metrics/<name>.jsonl`, no W&B, no
    periodic checkpoint."""
    return [f"batching.token_budget={token_budget}"] + [
        f"data.path={corpus_dir}",
        f"data.cache_dir={work / 'index'}",
        f"data.max_length={max_length}",
        "data.over_length=truncate",
        "buckets.num_buckets=auto",
        "batching.mode=token_budget",
        f"model.vocab_size={BYTE_VOCAB}",
        f"plan.seed={seed}",
        f"train.seed={seed}",
        *run_overrides(work, max_steps=max_steps),
        f"train.metrics_file={work / 'metrics' / f'{name}.jsonl'}",
        f"checkpoint.run_name={name}",
    ]


def measure_realtext(
    work_dir: str | Path,
    *,
    max_length: int = 512,
    max_steps: int | None = 300,
    token_budget: int | None = None,
    config: str = "configs/local_full.yaml",
    seed: int = 0,
    log=print,
) -> dict:
    """Train the config's model on the stdlib corpus (one run, every step logged), in padded
    batches of `token_budget` tokens (default: as many as the config's step holds); return the
    readability figures, per-bucket curves and means. Starts private local Ray if none is up."""
    import ray

    from pipeline.train.launch import run

    work = Path(work_dir).absolute()
    corpus = write_text_corpus(work / "pystdlib", progress=False)
    name = f"realtext-{uuid.uuid4().hex[:6]}"
    mfile = work / "metrics" / f"{name}.jsonl"
    overrides = realtext_overrides(
        work,
        corpus["out_dir"],
        name,
        max_length=max_length,
        max_steps=max_steps,
        token_budget=token_budget or config_step_tokens(config),
        seed=seed,
    )
    cfg = load_config(config, overrides)
    if not ray.is_initialized():
        # A private cluster: never attach to a cluster someone else started on this machine.
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    summary, wall = timed_run(run, cfg)
    s = run_summary(read_metric_lines(mfile))
    curves = {k: s[k] for k in ("loss", "loss_debiased", "bucket")}
    n = len(curves["loss"])
    readability = loss_readability(curves, skip=n // 4)
    per_bucket = bucket_curves(curves)
    means = _bucket_means(per_bucket, from_step=curves["loss"][n // 2][0] if n else 0)
    ks = np.array(sorted(means), dtype=np.float64)
    corr = float(np.corrcoef(ks, [means[int(k)] for k in ks])[0, 1]) if ks.size > 2 else None
    out = {
        "corpus": {k: corpus[k] for k in ("python", "samples", "tokens", "vocab_size")},
        "max_length": max_length,
        "token_budget": cfg.batching.token_budget,
        "max_steps": max_steps,
        "seed": seed,
        "steps": s["steps"],
        "num_buckets": s["num_buckets"],
        "padding_efficiency": s["padding_efficiency"],
        "wall_s": wall,
        "final_loss": summary.loss,
        "readability": readability,
        "bucket_mean_loss_late": {str(k): v for k, v in means.items()},
        "bucket_mean_loss_span": [min(means.values()), max(means.values())] if means else None,
        "bucket_loss_corr": corr,
        "curves": {**curves, "per_bucket": {str(k): v for k, v in per_bucket.items()}},
        "model": cfg.model.model_dump(),
    }
    log(
        f"realtext: {s['steps']} steps, {s['num_buckets']} buckets, readability debiased/raw "
        f"{readability['ratio']:.2f}, bucket-loss corr {corr if corr is None else round(corr, 2)}, "
        f"wall {wall:.0f}s"
    )
    return out
