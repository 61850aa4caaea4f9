"""Training signal on real text: loss readability and per-bucket loss curves on the stdlib corpus.

The synthetic corpus is equally predictable at every length, so its buckets have no loss offset
and `train/loss_debiased` has nothing to remove. Here the tiny decoder trains on the `pystdlib`
corpus (this Python's standard library split into functions, byte tokens; see
pipeline/data/textcorpus.py), where a bucket's loss depends on its lengths, through the real
`pipeline.train.launch.run` with optimal bucket edges, the config's own token budget (the
batches `make demo` trains on) and one metrics line per step. Reported:

- loss readability: the variance of the step-to-step change of `train/loss` and of
  `train/loss_debiased` over the same steps (`quality.loss_readability`), and their ratio;
- each bucket's own curve: the raw step loss at exactly the steps that trained that bucket
  (no running estimate), plus each bucket's mean loss over the second half of the run and its
  correlation with the bucket index.

    python -m bench.realtext --out benchmarks/realtext [--max-steps 300]
"""

from __future__ import annotations

import argparse
import json
import uuid
from pathlib import Path

import numpy as np

from bench.quality import loss_readability
from bench.training import read_metric_lines, run_overrides, run_summary, timed_run
from pipeline.core.config import load_config
from pipeline.data.textcorpus import BYTE_VOCAB, write_text_corpus

__all__ = ["bucket_curves", "measure_realtext", "plot_bucket_curves", "realtext_overrides"]


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
    token_budget: int | None = None,
    seed: int = 0,
) -> list[str]:
    """The config overrides of the real-text run: the corpus, optimal edges, one metrics line per
    step in `work/metrics/<name>.jsonl`, no W&B, no periodic checkpoint; the config's own token
    budget unless `token_budget` is given."""
    budget = [] if token_budget is None else [f"batching.token_budget={token_budget}"]
    return budget + [
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
    """Train the config's model on the stdlib corpus (one run, every step logged); return the
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
        token_budget=token_budget,
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


def plot_bucket_curves(result: dict, path: str | Path) -> str:
    """Raw step loss (grey), each bucket's own points joined (colour by bucket), and the debiased
    loss (black): the jumpy curve decomposes into smooth per-bucket curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = result["curves"]
    per = {int(k): v for k, v in c["per_bucket"].items()}
    cmap = plt.get_cmap("viridis")
    fig, ax = plt.subplots(figsize=(9, 4.8))
    s, v = zip(*c["loss"], strict=True)
    ax.plot(s, v, color="#bbbbbb", linewidth=0.8, label="train/loss (every step)", zorder=1)
    top = max(per) if per else 1
    for k, pts in per.items():
        ks, kv = zip(*pts, strict=True)
        ax.plot(ks, kv, color=cmap(k / max(top, 1)), linewidth=1.0, marker=".", markersize=3)
    s, v = zip(*c["loss_debiased"], strict=True)
    ax.plot(s, v, color="#000000", linewidth=0.9, alpha=0.8, label="train/loss_debiased", zorder=3)
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(0, top))
    fig.colorbar(sm, ax=ax, label="bucket (its points at the steps that trained it)")
    r = result["readability"]
    ax.set_title(
        f"Real text (Python {result['corpus']['python']} stdlib, byte tokens): "
        f"{result['num_buckets']} buckets, var Δ debiased / raw = {r['ratio']:.2f}",
        fontsize=10,
    )
    late = np.array([v for _, v in c["loss"]][len(c["loss"]) // 4 :])
    if late.size:  # the first steps fall by nats: zoom on the part where the buckets differ
        ax.set_ylim(float(late.min()) - 0.15, float(np.percentile(late, 99)) + 0.35)
    ax.set_xlabel("global step")
    ax.set_ylabel("loss (nats / token)")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m bench.realtext", description=__doc__)
    p.add_argument("--out", default="benchmarks/realtext", help="results.json and the PNG")
    p.add_argument("--work", default="out/bench-realtext", help="corpus, index, runs")
    p.add_argument("--max-steps", type=int, default=300)
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument(
        "--token-budget", type=int, help="default: the config's (local_full.yaml: 16384)"
    )
    p.add_argument("--seed", type=int, default=0, help="plan.seed and train.seed")
    p.add_argument("--config", default="configs/local_full.yaml")
    a = p.parse_args(argv)
    r = measure_realtext(
        a.work,
        max_length=a.max_length,
        max_steps=a.max_steps,
        token_budget=a.token_budget,
        config=a.config,
        seed=a.seed,
    )
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    r["png"] = plot_bucket_curves(r, out / "realtext_bucket_loss.png")
    (out / "results.json").write_text(json.dumps(r, indent=1))
    return r


if __name__ == "__main__":
    main()
