"""Benchmark figures (PNG, matplotlib Agg), each drawn by the script that measures it: padding and
recomposition (`bench.padding`), training throughput, loss curves and the per-bucket loss on real
text (`bench.training`), held-out loss by batching policy (`bench.outcome`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = [
    "TEAM_KTOK_S",
    "TEAM_MEASURED",
    "plot_bucket_curves",
    "plot_loss",
    "plot_outcome",
    "plot_padding",
    "plot_recomposition",
    "plot_training",
]

# The team's measured ratios to sorted-static: real tokens/s on their own 902K run.
TEAM_MEASURED = {"random": 0.375, "edges:team": 0.78}
TEAM_KTOK_S = {"sorted": 32.0, "random": 12.0, "edges:team": 25.1}


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on clusters or in CI
    import matplotlib.pyplot as plt

    return plt


def plot_padding(padding: dict, path: Path) -> None:
    """Padding efficiency relative to sorted-static, per policy, at B=32 and at a token budget."""
    plt = _plt()
    names = [b for b in padding["batchings"]]
    rows = padding["batchings"][names[0]]["policies"]
    labels = [p["label"] for p in rows]
    x = np.arange(len(labels))
    w = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(11, 4.8))
    for i, name in enumerate(names):
        by_name = {p["name"]: p for p in padding["batchings"][name]["policies"]}
        vals = [by_name[p["name"]]["vs_sorted"] for p in rows]  # rows of the first batching
        bars = ax.bar(
            x + (i - (len(names) - 1) / 2) * w, vals, w, label=_batching_label(padding, name)
        )
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
    for j, p in enumerate(rows):
        if p["name"] in TEAM_MEASURED:
            ax.plot(j, TEAM_MEASURED[p["name"]], "k_", markersize=28, mew=2)
    ax.plot([], [], "k_", markersize=12, mew=2, label="team measured (tokens/s vs sorted)")
    ax.set_xticks(x, labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("padding efficiency / sorted-static")
    ax.set_ylim(0, 1.12)
    ax.set_title(f"Padding efficiency vs sorted-static, {padding['samples']:,} samples (simulated)")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _batching_label(padding: dict, name: str) -> str:
    b = padding["batchings"][name]["batching"]
    if b["mode"] == "fixed":
        return f"micro-batch {b['batch_size']}"
    return f"token budget {b['token_budget']:,}"


def plot_training(training: dict, path: Path) -> None:
    """Real tokens/s relative to sorted-static (median, each round as a dot) beside padding."""
    plt = _plt()
    pol = training["policies"]
    names = list(pol)
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(9, 4.8))
    sorted_pad = pol[names[0]]["padding_efficiency"]
    tok = ax.bar(x - 0.2, [pol[n]["vs_sorted"] for n in names], 0.4, label="real tokens/s (median)")
    ax.bar_label(tok, fmt="%.2f", fontsize=8, padding=1)
    pad = ax.bar(
        x + 0.2,
        [pol[n]["padding_efficiency"] / sorted_pad for n in names],
        0.4,
        color="#bbbbbb",
        label="padding efficiency",
    )
    ax.bar_label(pad, fmt="%.2f", fontsize=8, padding=1)
    for i, n in enumerate(names):
        ys = pol[n]["vs_sorted_all"]
        ax.plot([i - 0.2] * len(ys), ys, "o", color="#222222", markersize=3)
        if n in TEAM_MEASURED:
            ax.plot(i - 0.2, TEAM_MEASURED[n], "r_", markersize=22, mew=2)
    ax.axhline(0.93, color="#228833", linewidth=0.8, linestyle="--", label="goal for ours: 0.93")
    ax.plot([], [], "o", color="#222222", markersize=3, label="each round")
    ax.plot([], [], "r_", markersize=12, mew=2, label="team measured")
    ax.set_xticks(x, [_train_label(training, n) for n in names], fontsize=8)
    ax.set_ylabel("relative to sorted-static (same round)")
    b = training["batching"]
    size = f"B={b['batch_size']}" if b.get("mode") == "fixed" else f"budget {b.get('token_budget')}"
    ax.set_title(
        f"Tiny model, 2 CPU workers, {training['num_samples']:,} samples x 1 epoch, {size}, "
        f"lengths x{training['scale']:.4g}; {training['repeats']} round(s)",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _train_label(training: dict, name: str) -> str:
    k = training["policies"][name]["num_buckets"]
    return {"edges:team": "team's six edges", "optimal:auto": f"optimal auto (K={k})"}.get(
        name, name
    )


def plot_loss(training: dict, policies: list[str], path: Path) -> None:
    """Per bucketed run: the raw step loss, the bucket-debiased loss and each bucket's running loss."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(policies), figsize=(6.5 * len(policies), 4.6), squeeze=False)
    for ax, name in zip(axes[0], policies, strict=True):
        c = training["policies"][name]["curves"]
        cmap = plt.get_cmap("viridis")
        buckets = sorted(c["loss_by_bucket"], key=int)
        for i, k in enumerate(buckets):
            s, v = zip(*c["loss_by_bucket"][k], strict=True)
            ax.plot(s, v, color=cmap(i / max(len(buckets) - 1, 1)), linewidth=0.8, alpha=0.6)
        s, v = zip(*c["loss"], strict=True)
        ax.plot(s, v, color="#cc3311", linewidth=1.0, label="train/loss (raw step loss)")
        s, v = zip(*c["loss_debiased"], strict=True)
        ax.plot(s, v, color="#000000", linewidth=1.6, label="train/loss_debiased")
        ax.plot(
            [], [], color=cmap(0.5), label="train/loss_by_bucket/<k> (short: dark, long: light)"
        )
        ax.set_title(f"{_train_label(training, name)}: {len(buckets)} buckets", fontsize=10)
        ax.set_xlabel("global step")
        ax.set_ylabel("loss")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_recomposition(quality: dict, path: Path) -> None:
    """Batch recomposition between epochs 0 and 1 per policy, beside its chance floor."""
    plt = _plt()
    names = list(quality["recomposition"])
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4.4), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        rows = quality["recomposition"][name]["rows"]
        x = np.arange(len(rows))
        bars = ax.bar(x - 0.2, [100 * r["recomposition"] for r in rows], 0.4, label="measured")
        ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=1)
        floor = [100 * r["chance_floor"] if r["chance_floor"] is not None else 0 for r in rows]
        ax.bar(x + 0.2, floor, 0.4, color="#bbbbbb", label="chance floor (fresh shuffle)")
        ax.axhline(1.0, color="#cc3311", linewidth=0.8, linestyle="--", label="target 1%")
        ax.set_xticks(x, [r["name"] for r in rows], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("% of epoch-1 micro-batches repeating a pair")
        ax.set_title(quality["recomposition"][name]["label"], fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_bucket_curves(result: dict, path: str | Path) -> str:
    """Raw step loss (grey), each bucket's own points joined (colour by bucket), and the debiased
    loss (black): the jumpy curve decomposes into smooth per-bucket curves."""
    plt = _plt()

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


def _seed_band(runs: dict, x: str, rate: float = 1.0):
    """(x grid, mean loss, min, max) over seeds, each seed interpolated on a common grid."""
    xs, ys = [], []
    for r in runs.values():
        ev = r["eval"]
        xv = np.asarray(ev["step"] if x == "step" else ev["real_tokens"], float) * rate
        xs.append(xv)
        ys.append(np.asarray(ev["loss"], float))
    top = min(v[-1] for v in xs)
    grid = np.linspace(0, top, 200)
    stack = np.array([np.interp(grid, xv, yv) for xv, yv in zip(xs, ys, strict=True)])
    return grid, stack.mean(0), stack.min(0), stack.max(0)


def plot_outcome(results: dict, path: str | Path, labels: dict[str, str]) -> str:
    """Held-out loss at equal optimisation (against steps) and at equal time (against seconds
    and against real tokens) from `bench.outcome`'s results (with their `summary`): each policy's
    mean over seeds under its label, the band their min to max."""
    plt = _plt()
    runs = results["runs"]
    equal_time = results["summary"].get("time")
    panels = [("optimisation", "step", "global step (equal optimisation)")]
    if "throughput" in results:
        panels += [
            ("optimisation", "tokens", "real tokens"),
            ("optimisation", "time", "seconds at the measured rate (equal time)"),
        ]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.6), squeeze=False)
    names = list(labels)
    cmap = plt.get_cmap("tab10")
    for ax, (q, x, label) in zip(axes[0], panels, strict=True):
        lows = []
        for name, by_seed in runs[q].items():
            if x == "time" and name not in results["throughput"]:
                continue
            rate = results["throughput"][name]["s_per_real_token"] if x == "time" else 1.0
            grid, mean, lo, hi = _seed_band(by_seed, "step" if x == "step" else "tokens", rate)
            # A windowed variant (`<policy>_w<n>`) is drawn in its policy's colour, dashed.
            base, _, windows = name.partition("_w")
            base = base if windows.isdigit() else name
            color = cmap(names.index(base) % 10 if base in names else 9)
            ls = (0, (1.5 + 4 / max(int(windows), 1), 1.5)) if windows.isdigit() else "-"
            ax.plot(grid, mean, color=color, lw=1.4, ls=ls, label=labels.get(name, name))
            ax.fill_between(grid, lo, hi, color=color, alpha=0.15 if ls == "-" else 0.06, lw=0)
            lows.append(float(mean[len(mean) // 3]))
        if x == "time" and equal_time:
            budget = next(iter(equal_time.values()))["budget_s"]
            ax.axvline(budget, color="k", ls=":", lw=1, label="budget: sorted-static's time")
        ax.set_xlabel(label)
        ax.set_ylabel("held-out loss (nats per token)")
        bottom = min(min(r["eval"]["loss"]) for b in runs[q].values() for r in b.values())
        ax.set_ylim(bottom - 0.02, max(lows) + 0.05)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="upper right")
    fig.suptitle("Held-out loss by batching policy (mean over seeds; band: min to max)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return str(path)
