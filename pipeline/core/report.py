"""Padding report: simulated padding efficiency of batching policies on one set of sample lengths.

Every policy is scored the same way: each rank's micro-batch is padded to its longest sample
rounded up to `pad_to_multiple_of` (never beyond the bucket's upper edge for bucketed policies),
and efficiency is real tokens / padded slots. Policies: `sorted` (all lengths sorted, fixed
batches: the static upper bound), `random` (one permutation, fixed batches), `megabatch` (the
`group_by_length` of HF transformers' LengthGroupedSampler), and bucketed ones (`edges:<name>`,
`optimal:K`) run through the real `epoch_plan`. `auto_search` reports the K that `num_buckets:
auto` picks (`pipeline.core.epochs.auto_edges`). Pure numpy, no per-sample Python loops.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from pipeline.core.buckets import EdgeTable, optimize_all, padded_to_edges
from pipeline.core.config import TEAM_EDGES, Batching, PlanConfig
from pipeline.core.epochs import auto_edges, simulated_efficiency
from pipeline.core.metrics import micro_batch_padded
from pipeline.core.plan import (
    EpochPlan,
    epoch_plan,
    global_batch_sizes,
    length_order,
    split_offsets,
)

__all__ = [
    "MEGABATCH_MULT",
    "POLICY_LABELS",
    "policy_label",
    "PolicyScore",
    "AutoResult",
    "fixed_batch_size",
    "sorted_order",
    "random_order",
    "megabatch_order",
    "order_score",
    "plan_score",
    "compare_policies",
    "auto_search",
    "bucket_rows",
    "build_report",
    "render_text",
    "truncation_line",
    "plot_report",
]

# transformers.trainer_pt_utils.get_length_grouped_indices: megabatch_mult defaults to
# min(len(lengths) // (batch_size * 4), 50), at least 1.
MEGABATCH_MULT = 50
# RNG stream tags for the non-bucketed policies, so they never share a stream with a plan's
# (seed, epoch, bucket) or (seed, epoch, INTERLEAVE_STREAM) generators.
_RANDOM_STREAM, _MEGABATCH_STREAM = 0x52414E44, 0x4D454741
DEFAULT_COMPARE_KS = (6, 16, 32, 64)
# Readable names of the policies in reports, tables and plots.
POLICY_LABELS = {
    "sorted": "sorted-static",
    "random": "random",
    "megabatch": "megabatch (HF group_by_length)",
    "edges:team": "team's six edges",
}


def policy_label(name: str, auto_k: int | None = None) -> str:
    """A policy's readable name: `optimal:K` -> "optimal edges, K=K", `optimal:auto` with its K."""
    if name == "optimal:auto":
        return f"optimal edges, auto (K={auto_k})" if auto_k else "optimal edges, auto"
    if name.startswith("optimal:"):
        return f"optimal edges, K={name.split(':')[1]}"
    return POLICY_LABELS.get(name, name)


@dataclass(frozen=True)
class PolicyScore:
    """One policy's simulated padding on the whole epoch."""

    name: str
    real_tokens: int
    padded_tokens: int
    micro_batches: int
    batch_size: int | None  # global samples per step; None: per bucket, from the plan

    @property
    def efficiency(self) -> float:
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0


@dataclass(frozen=True)
class AutoResult:
    """Outcome of `auto_search`: the chosen K, its efficiency and its neighbour's below."""

    k: int
    edges: list[int]
    efficiency: float
    target: float
    reached: bool  # False: even max_k misses the target; k is then max_k
    below: float | None  # efficiency at K - 1 (None for K = 1); < target when the search is sound


def fixed_batch_size(lengths: np.ndarray, batching: Batching) -> int:
    """Global samples per step for the non-bucketed policies (sorted, random, megabatch).

    `fixed` mode: `batching.batch_size`, the same B as the bucketed plan. `token_budget` mode: a
    fixed-size batcher cannot adapt B to the lengths it draws, so it must size B for the worst case
    under the same memory bound: B = token_budget // max(lengths), rounded like any plan bucket
    (i.e. what the plan gives one bucket spanning all lengths). Bucketed policies instead get the
    plan's per-bucket token-budget batches.
    """
    if batching.mode == "fixed":
        return batching.batch_size
    return int(global_batch_sizes([0, int(np.max(lengths))], batching)[0])


def sorted_order(lengths: np.ndarray) -> np.ndarray:
    """All samples by ascending length, ties by position: the plan's sorted baseline
    (`pipeline.core.plan.length_order`), adjacent batches sharing lengths (the static upper bound)."""
    lengths = np.asarray(lengths)
    return length_order(lengths, np.arange(lengths.size))


def random_order(lengths: np.ndarray, seed: int = 0) -> np.ndarray:
    """One uniformly random permutation of the samples."""
    return np.random.default_rng((seed, _RANDOM_STREAM)).permutation(np.asarray(lengths).size)


def megabatch_order(
    lengths: np.ndarray,
    batch_size: int,
    seed: int = 0,
    *,
    mult: int | None = None,
    longest_first: bool = True,
) -> np.ndarray:
    """HF `group_by_length` order: a random permutation cut into windows of `mult` batches, each
    window sorted by length descending (stable, like Python's `sorted(..., reverse=True)`).

    `mult` defaults to HF's min(n // (4 * batch_size), 50), at least 1. With `longest_first`, HF
    swaps the head of the window holding the longest sample with the head of window 0, so an OOM
    shows at the first step. Batches here are global batches (split over ranks afterwards),
    which is exact for one rank and HF's per-process view scaled up for several.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    n = lengths.size
    if mult is None:
        mult = max(1, min(n // (batch_size * 4), MEGABATCH_MULT))
    window = mult * batch_size
    perm = np.random.default_rng((seed, _MEGABATCH_STREAM)).permutation(n)
    order = perm[np.lexsort((-lengths[perm], np.arange(n) // window))]
    if longest_first and n:
        heads = np.arange(0, n, window)
        j = heads[int(np.argmax(lengths[order[heads]]))]
        order[[0, j]] = order[[j, 0]]
    return order


def _micro_offsets(global_sizes: np.ndarray, world_size: int) -> np.ndarray:
    """Flat offsets of every (step, rank) micro-batch, split by the plan's rule (`split_offsets`)."""
    step_offsets = np.concatenate([[0], np.cumsum(np.asarray(global_sizes, dtype=np.int64))])
    mo = split_offsets(step_offsets, world_size)
    return np.concatenate([mo[:, :-1].ravel(), step_offsets[-1:]])


def order_score(
    name: str,
    lengths: np.ndarray,
    order: np.ndarray,
    batch_size: int,
    *,
    world_size: int = 1,
    multiple: int = 1,
) -> PolicyScore:
    """Score samples taken in `order`, cut into global batches of `batch_size` (last one partial),
    each split over `world_size` ranks; padding is per micro-batch, uncapped."""
    lens = np.asarray(lengths, dtype=np.int64)[order]
    n = lens.size
    steps = -(-n // batch_size)
    sizes = np.full(steps, batch_size, dtype=np.int64)
    if steps:
        sizes[-1] = n - batch_size * (steps - 1)
    offsets = _micro_offsets(sizes, world_size)
    padded = int(micro_batch_padded(lens, offsets, multiple=multiple).sum())
    return PolicyScore(name, int(lens.sum()), padded, offsets.size - 1, batch_size)


def plan_score(name: str, plan: EpochPlan) -> PolicyScore:
    """Score an epoch plan's micro-batches, padding capped at each step's bucket upper edge."""
    lens, offsets = plan.micro_batch_lengths()
    cap = plan.edges[1:][plan.micro_batch_buckets()]
    padded = micro_batch_padded(lens, offsets, multiple=plan.pad_to_multiple_of, cap=cap).sum()
    return PolicyScore(name, int(lens.sum()), int(padded), offsets.size - 1, None)


def compare_policies(
    lengths: np.ndarray,
    edge_sets: Mapping[str, Sequence[int]],
    *,
    batching: Batching,
    world_size: int = 1,
    seed: int = 0,
    epoch: int = 0,
    plan: PlanConfig | None = None,
) -> list[PolicyScore]:
    """sorted, random, megabatch, then one bucketed policy per named edge list (in given order)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    B = fixed_batch_size(lengths, batching)
    kw = dict(world_size=world_size, multiple=batching.pad_to_multiple_of)
    # The epoch number perturbs the non-bucketed permutations too, like a per-epoch reshuffle.
    s = (seed, epoch)
    scores = [
        order_score("sorted", lengths, sorted_order(lengths), B, **kw),
        order_score("random", lengths, random_order(lengths, s), B, **kw),
        order_score("megabatch", lengths, megabatch_order(lengths, B, s), B, **kw),
    ]
    for name, edges in edge_sets.items():
        p = epoch_plan(
            lengths,
            edges,
            batching=batching,
            world_size=world_size,
            seed=seed,
            epoch=epoch,
            plan=plan,
        )
        scores.append(plan_score(name, p))
    return scores


def auto_search(
    lengths: np.ndarray,
    batching: Batching,
    *,
    target: float = 0.97,
    max_k: int = 64,
    world_size: int = 1,
    seed: int = 0,
    plan: PlanConfig | None = None,
    table: EdgeTable | None = None,
) -> AutoResult:
    """The K that `buckets.num_buckets: auto` gives training, with the efficiencies behind it.

    The choice itself is `pipeline.core.epochs.auto_edges` (one `optimize_all` run, then a doubling
    and bisection search over K, each candidate scored on a real epoch-0 plan), so the report
    shows exactly what a run would use. Efficiency is only near-monotone in K, so the result
    also carries the efficiency at K - 1: a value at or above the target there would expose a
    wiggle the search stepped over.
    """
    plan_cfg = (plan or PlanConfig()).model_copy(update={"seed": seed})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a missed target is reported in the result instead
        edges = auto_edges(lengths, batching, plan_cfg, target, max_k, world_size)
    k = len(edges) - 1
    eff = simulated_efficiency(lengths, edges, batching, plan_cfg, world_size)
    below = None
    if k > 1:
        table = table if table is not None and max(table.edges) >= k else optimize_all(lengths, k)
        below = simulated_efficiency(lengths, table.for_k(k - 1), batching, plan_cfg, world_size)
    return AutoResult(k, edges, eff, target, eff >= target, below)


def bucket_rows(plan: EpochPlan, batching: Batching) -> list[dict]:
    """Per bucket: edges, samples, tokens, steps, global and per-rank batch size, and the padding
    cost of padding every sample to the upper edge."""
    s = plan.summary()
    edges = plan.edges.tolist()
    g = global_batch_sizes(edges, batching)
    rows = []
    for k in range(plan.num_buckets):
        n, tok, upper = s["samples_per_bucket"][k], s["tokens_per_bucket"][k], edges[k + 1]
        rows.append(
            {
                "bucket": k,
                "lower": edges[k],
                "upper": upper,
                "samples": n,
                "tokens": tok,
                "steps": s["steps_per_bucket"][k],
                "global_batch": int(g[k]),
                "micro_batch": int(-(-g[k] // plan.world_size)),
                "padded_to_upper": n * upper,
                "upper_efficiency": tok / (n * upper) if n else 1.0,
            }
        )
    return rows


def _length_stats(lengths: np.ndarray) -> dict:
    q = np.percentile(lengths, [50, 90, 99])
    return {
        "samples": int(lengths.size),
        "tokens": int(lengths.sum()),
        "min": int(lengths.min()),
        "mean": float(lengths.mean()),
        "p50": float(q[0]),
        "p90": float(q[1]),
        "p99": float(q[2]),
        "max": int(lengths.max()),
    }


def _timed(log: Callable[[str], None], what: str, fn: Callable):
    t = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t
    log(f"{what}: {dt:.3f}s")
    return out, dt


def build_report(
    lengths: np.ndarray,
    *,
    batching: Batching,
    edges: Sequence[int] | None = None,
    num_buckets: int | str = "auto",
    target: float = 0.97,
    max_k: int = 64,
    world_size: int = 1,
    seed: int = 0,
    epoch: int = 0,
    plan: PlanConfig | None = None,
    sample_ids: np.ndarray | None = None,
    compare_ks: Sequence[int] = DEFAULT_COMPARE_KS,
    log: Callable[[str], None] = lambda _: None,
) -> tuple[dict, EpochPlan]:
    """The bucket report (a JSON-ready dict) and the epoch plan of the chosen edges.

    The chosen edges are `edges` when given, else optimal for `num_buckets` (an int, or "auto"
    for `auto_search`). The policy table always holds sorted, random, megabatch, the team's six
    edges (when every length fits under them), the chosen edges and optimal:K for `compare_ks`.
    `log` receives progress and timing lines (the CLI prints them on stderr).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    timings: dict[str, float] = {}
    chosen: dict = {}
    ks = sorted(
        {k for k in compare_ks if k <= max_k}
        | ({num_buckets} if isinstance(num_buckets, int) else set())
    )
    need_k = max(ks + ([max_k] if num_buckets == "auto" else []), default=1)
    table, timings["optimize_all_s"] = _timed(
        log,
        f"optimize_all(max_k={need_k}) on {lengths.size:,} samples",
        lambda: optimize_all(lengths, need_k),
    )
    if edges is not None:
        chosen = {"name": "edges:given", "source": "given", "edges": [int(e) for e in edges]}
    elif num_buckets == "auto":
        res, timings["auto_search_s"] = _timed(
            log,
            f"auto search (target {target})",
            lambda: auto_search(
                lengths,
                batching,
                target=target,
                max_k=max_k,
                world_size=world_size,
                seed=seed,
                plan=plan,
                table=table,
            ),
        )
        chosen = {
            "name": f"optimal:{res.k}",
            "source": "auto",
            "edges": res.edges,
            "auto": asdict(res),
        }
        ks = sorted(set(ks) | {res.k})
        # The optimiser alone, for the chosen K (the auto figure above includes the plans).
        _, timings["optimize_s"] = _timed(
            log, f"optimize(K={res.k})", lambda: optimize_all(lengths, res.k)
        )
    else:
        k = int(num_buckets)
        e, timings["optimize_s"] = _timed(
            log, f"optimize(K={k})", lambda: optimize_all(lengths, k).for_k(k)
        )
        chosen = {"name": f"optimal:{k}", "source": "optimal", "edges": e}
    chosen["num_buckets"] = len(chosen["edges"]) - 1

    the_plan, timings["plan_s"] = _timed(
        log,
        f"epoch_plan({chosen['name']}, world_size={world_size})",
        lambda: epoch_plan(
            lengths,
            chosen["edges"],
            batching=batching,
            world_size=world_size,
            seed=seed,
            epoch=epoch,
            plan=plan,
            sample_ids=sample_ids,
        ),
    )

    edge_sets: dict[str, list[int]] = {}
    if lengths.max() <= TEAM_EDGES[-1]:
        edge_sets["edges:team"] = TEAM_EDGES
    if chosen["source"] == "given":
        edge_sets["edges:given"] = chosen["edges"]
    for k in ks:
        edge_sets[f"optimal:{k}"] = table.for_k(k)
    scores, timings["simulate_s"] = _timed(
        log,
        f"simulate {3 + len(edge_sets)} policies",
        lambda: compare_policies(
            lengths,
            edge_sets,
            batching=batching,
            world_size=world_size,
            seed=seed,
            epoch=epoch,
            plan=plan,
        ),
    )
    sorted_eff = scores[0].efficiency
    random_eff = scores[1].efficiency
    policies = [
        {
            "name": s.name,
            "efficiency": s.efficiency,
            "vs_sorted": s.efficiency / sorted_eff,
            # Compute per real token scales with padded tokens (ignoring attention's L^2 term).
            "speedup_vs_random": s.efficiency / random_eff,
            "real_tokens": s.real_tokens,
            "padded_tokens": s.padded_tokens,
            "micro_batches": s.micro_batches,
            "batch_size": s.batch_size,
            "edges": edge_sets.get(s.name),
        }
        for s in scores
    ]
    real = int(lengths.sum())
    padded_upper = padded_to_edges(lengths, chosen["edges"])
    summary = the_plan.summary()
    sizes = np.diff(the_plan.micro_offsets, axis=1)
    report = {
        "lengths": _length_stats(lengths),
        "batching": {
            **batching.model_dump(),
            "non_bucketed_batch_size": fixed_batch_size(lengths, batching),
        },
        "world_size": world_size,
        "seed": seed,
        "epoch": epoch,
        "chosen": chosen,
        "buckets": bucket_rows(the_plan, batching),
        "policies": policies,
        "to_upper_edge": {
            "real_tokens": real,
            "padded_tokens": padded_upper,
            "padding_tokens": padded_upper - real,
            "efficiency": real / padded_upper,
        },
        "plan": {
            "steps": summary["steps"],
            "samples": summary["samples"],
            "dropped": summary["dropped"],
            "micro_batches": int(sizes.size),
            "empty_micro_batches": int((sizes == 0).sum()),
            "hash": summary["hash"],
        },
        "timings": timings,
    }
    return report, the_plan


def truncation_line(t: dict) -> str:
    """One line on what truncation at the top edge cuts (`pipeline.core.metrics.truncation_counts`
    plus the `top` it cut at); the lengths above are after the cut."""
    share = t["truncated_tokens"] / t["tokens"] if t["tokens"] else 0.0
    return (
        f"truncated at {t['top']}: {t['truncated_samples']:,} samples, "
        f"{t['truncated_tokens']:,} tokens ({share:.1%} of {t['tokens']:,})"
    )


def render_text(report: dict) -> str:
    """The report as a readable plain-text table."""
    L, b, ch = report["lengths"], report["batching"], report["chosen"]
    out = []
    out.append(
        f"samples {L['samples']:,}  tokens {L['tokens']:,}  length min {L['min']} p50 {L['p50']:.0f} "
        f"p90 {L['p90']:.0f} p99 {L['p99']:.0f} max {L['max']} mean {L['mean']:.0f}"
    )
    if "truncation" in report:
        out.append(truncation_line(report["truncation"]))
    if b["mode"] == "fixed":
        sizing = f"fixed batch {b['batch_size']} (global)"
    else:
        sizing = (
            f"token budget {b['token_budget']:,} per global step (non-bucketed policies: fixed batch "
            f"{b['non_bucketed_batch_size']} = budget // max length)"
        )
    out.append(
        f"batching: {sizing}; pad_to_multiple_of {b['pad_to_multiple_of']}; world size "
        f"{report['world_size']}; seed {report['seed']} epoch {report['epoch']}"
    )
    src = {"given": "given", "optimal": "optimal (exact DP)", "auto": "auto"}[ch["source"]]
    out.append(f"\nedges ({src}, K={ch['num_buckets']}): {ch['edges']}")
    if "auto" in ch:
        a = ch["auto"]
        below = "" if a["below"] is None else f"; K={a['k'] - 1}: {a['below']:.4f}"
        verdict = "reached" if a["reached"] else "NOT reached (max K used)"
        out.append(
            f"auto: target {a['target']} {verdict} at K={a['k']} ({a['efficiency']:.4f}{below})"
        )
    out.append("\nper bucket (padding every sample to its bucket's upper edge):")
    hdr = f"{'bucket':>6} {'range':>13} {'samples':>9} {'tokens':>13} {'steps':>7} {'global B':>8} {'micro B':>7} {'eff@upper':>9}"
    out.append(hdr)
    for r in report["buckets"]:
        rng = f"({r['lower']},{r['upper']}]"
        out.append(
            f"{r['bucket']:>6} {rng:>13} {r['samples']:>9,} {r['tokens']:>13,} {r['steps']:>7,} "
            f"{r['global_batch']:>8} {r['micro_batch']:>7} {r['upper_efficiency']:>9.3f}"
        )
    u = report["to_upper_edge"]
    out.append(
        f"to-upper-edge padding: {u['padded_tokens']:,} padded tokens for {u['real_tokens']:,} real "
        f"({u['padding_tokens']:,} padding, efficiency {u['efficiency']:.4f})"
    )
    out.append("\npadding efficiency per policy (real / padded slots, batch-max padding):")
    out.append(
        f"{'policy':<16} {'efficiency':>10} {'vs sorted':>9} {'vs random':>9} {'micro-batches':>13}"
    )
    for p in report["policies"]:
        mark = "  <- chosen" if p["name"] == ch["name"] else ""
        out.append(
            f"{p['name']:<16} {p['efficiency']:>10.4f} {p['vs_sorted']:>9.3f} {p['speedup_vs_random']:>8.2f}x "
            f"{p['micro_batches']:>13,}{mark}"
        )
    pl, t = report["plan"], report["timings"]
    out.append(
        f"\nplan: {pl['steps']:,} steps, {pl['samples']:,} samples, {pl['dropped']} dropped, "
        f"{pl['empty_micro_batches']:,} empty micro-batches of {pl['micro_batches']:,}; hash {pl['hash']}"
    )
    out.append("timings: " + ", ".join(f"{k.removesuffix('_s')} {v:.3f}s" for k, v in t.items()))
    return "\n".join(out)


def plot_report(report: dict, lengths: np.ndarray, path) -> None:
    """PNG: length histogram with the chosen edges, each bucket shaded by its padding share, over
    a panel of each bucket's padding share (every sample padded to its upper edge)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on clusters or in CI
    import matplotlib.pyplot as plt

    lengths = np.asarray(lengths)
    edges = np.asarray(report["chosen"]["edges"])
    rows = report["buckets"]
    top = int(max(edges[-1], lengths.max()))
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 7), sharex=True, height_ratios=[3, 2])
    bins = np.arange(0, top + 32, 32)
    ax.hist(lengths, bins=bins, color="#4477aa", linewidth=0, zorder=2)
    share = np.array([1 - r["upper_efficiency"] for r in rows])
    for r, sh in zip(rows, share, strict=True):
        # Redder = more of the bucket's slots are padding; scaled to the worst bucket so it shows.
        alpha = 0.5 * sh / share.max() if share.max() > 0 else 0.0
        ax.axvspan(r["lower"], r["upper"], color="#cc3311", alpha=alpha, linewidth=0, zorder=0)
    for e in edges[1:]:
        ax.axvline(e, color="#222222", linewidth=0.6, zorder=3)
    ax.set_ylabel("samples per 32-token bin")
    eff = {p["name"]: p["efficiency"] for p in report["policies"]}
    name = report["chosen"]["name"]
    ax.set_title(
        f"{report['lengths']['samples']:,} samples, {name} (K={len(edges) - 1}): batch-max efficiency "
        f"{eff.get(name, float('nan')):.3f}, sorted {eff['sorted']:.3f}, random {eff['random']:.3f}\n"
        "lines: bucket upper edges; red shading: padding share when padded to the upper edge",
        fontsize=10,
    )
    lo = np.array([r["lower"] for r in rows])
    width = np.array([r["upper"] - r["lower"] for r in rows])
    ax2.bar(
        lo,
        100 * share,
        width=width,
        align="edge",
        color="#cc3311",
        edgecolor="white",
        linewidth=0.5,
    )
    u = report["to_upper_edge"]
    ax2.text(
        0.99,
        0.95,
        f"all buckets: {u['padding_tokens'] / 1e6:,.1f}M padding tokens for "
        f"{u['real_tokens'] / 1e6:,.1f}M real ({100 * (1 - u['efficiency']):.1f}%)",
        transform=ax2.transAxes,
        ha="right",
        va="top",
    )
    ax2.set_ylim(0, 100 * share.max() * 1.25 + 1e-9)  # headroom for the note
    ax2.set_ylabel("padding share per bucket (%)")
    ax2.set_xlabel("sample length (tokens)")
    ax2.set_xlim(0, top * 1.01)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
