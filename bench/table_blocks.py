"""The tables of BENCHMARKS.md, one function per block, each from the benchmarks' JSON (`r`:
`{name: benchmarks/<name>.json}`); `bench.tables` puts them in the document.

A table is written as its columns, `"header=key:format"` joined by " | " (`columns`): `key` is a
field of each row (`a.b` a nested one, `key/1e6` scaled), `format` a Python format spec; a
missing or null field renders as n/a. Cells hold figures and names, never sentences.
"""

from __future__ import annotations

import statistics

from bench.plots import TEAM_MEASURED

__all__ = ["NAMES", "columns", "name", "ran_on", "rerun", "team"]

NAMES = {
    "sorted": "sorted-static",
    "random": "random",
    "megabatch": "megabatch (HF `group_by_length`)",
    "edges:team": "team's six edges",
    "packed": "packed rows, full shuffle",
    "auto": "padded, bucketed (auto edges)",
}
MB = 1e6


def _cell(row: dict, spec: str) -> str:
    key, _, fmt = spec.partition(":")
    key, _, scale = key.partition("/")
    value = row
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return "n/a"
    return format(value / float(scale) if scale else value, fmt)


def columns(spec: str, rows: list[dict]) -> str:
    """A Markdown table of `rows`, one column per `"header=key:format"` of `spec`."""
    cols = [c.strip().rpartition("=") for c in spec.split(" | ")]
    out = ["| " + " | ".join(h for h, _, _ in cols) + " |", "|" + "---|" * len(cols)]
    return "\n".join(
        out + ["| " + " | ".join(_cell(r, k) for _, _, k in cols) + " |" for r in rows]
    )


def name(name: str, k: int | None = None) -> str:
    if name == "optimal:auto":
        return f"optimal edges, auto (K={k})" if k else "optimal edges, auto"
    if name.startswith("optimal:"):
        return f"optimal edges, K={name.split(':')[1]}"
    return NAMES.get(name, name)


def _load1(x) -> str:
    """A 1-minute load average, from a number or a (1, 5, 15)-minute list."""
    x = x[0] if isinstance(x, list) and x else x
    return f"{x:.1f}" if isinstance(x, int | float) else "n/a"


def _loads(pairs) -> str:
    return ", ".join(f"{_load1(a)} → {_load1(b)}" for a, b in (p or (None, None) for p in pairs))


def team(name: str) -> str:
    """The team's own measured real tokens/s against sorted-static, where they measured it."""
    x = 1.0 if name == "sorted" else TEAM_MEASURED.get(name)
    return "" if x is None else f"{x:.3f}"


def _list(xs, fmt: str = ".2f") -> str:
    return ", ".join(format(x, fmt) for x in xs)


def ran_on(name: str, meta: dict) -> str:
    """Which command, machine and date the figures of benchmarks/<name>.json come from, and the
    command that measures them again."""
    m = meta.get("machine", {})
    ram = f", {m['ram_gib']} GiB RAM" if m.get("ram_gib") else ""
    git = m.get("git_commit") and m["git_commit"] + " (uncommitted changes)" * m.get("git_dirty", 0)
    row = {
        "command": f"`{meta['command']}`",
        "date": meta["date_utc"],
        "machine": f"{m.get('cpu')}, {m.get('cores')} cores{ram}, GPU: {m.get('gpu') or 'none'}",
        "git": git or "-",
        "load": f"{_load1(meta.get('load_before'))} → {_load1(meta.get('load_after'))}",
        "minutes": meta.get("duration_s", 0) / 60 or None,
        "rerun": f"`{rerun(name)}`",
    }
    return columns(
        "measured by=command | date=date | machine=machine | git=git"
        " | load average (1 min) before → after=load | minutes=minutes:.1f | rerun with=rerun",
        [row],
    )


def rerun(name: str) -> str:
    return f"python -m bench.{name} --out benchmarks/{name}.json"


# ------------------------------------------------------------------ padding.json


def padding(r: dict) -> str:
    blocks = r["padding"]["padding"]["batchings"]
    spec, rows = ["policy=policy"], {}
    for tag, b in blocks.items():
        x = b["batching"]
        size = f"micro-batch {x.get('batch_size')}"
        size = size if x["mode"] == "fixed" else f"token budget {x['token_budget']:,}"
        spec += [f"efficiency ({size})={tag}.efficiency", f"vs sorted={tag}.vs_sorted:.3f"]
        for p in b["policies"]:
            k = f" (K={b['auto']['k']})" if p["name"] == "optimal:auto" else ""
            row = rows.setdefault(p["name"], {"policy": name(p["name"])})
            row[tag] = p | {"efficiency": f"{p['efficiency']:.4f}{k}"}
    first = next(iter(blocks.values()))["policies"]  # lhotse, budget only: in the full batches
    return columns(" | ".join(spec), [rows[p["name"]] for p in first])


def planning(r: dict) -> str:
    c = r["padding"]["padding"]["costs"]
    base = c["sizes"]["preset"]
    rows = [
        s | {"opt_x": s["optimize_s"] / base["optimize_s"], "plan_x": s["plan_s"] / base["plan_s"]}
        for s in c["sizes"].values()
    ]
    return columns(
        f"samples=samples:, | tokens (M)=tokens/1e6:,.0f | optimize K={c['k']} (s, median of"
        f" {c['repeats']})=optimize_s:.3f | vs the preset=opt_x:.1f | epoch plan, "
        f"{c['world_size']} ranks (s)=plan_s:.3f | vs the preset=plan_x:.1f | steps=steps:,",
        rows,
    )


def fullbatch(r: dict) -> str:
    t = r["padding"]["padding"]["budget"]
    return columns(
        "ranks=ranks | batcher=name | fill=fill:.3f | steps=steps:, | steps vs ref="
        "steps_vs_reference:.3f | padding eff.=efficiency:.4f | eff. vs ref="
        "efficiency_vs_reference:.3f | over budget=over_budget_steps:, | max step / budget="
        "max_step_over_budget:.2f | micro / share=max_micro_over_share:.2f",
        [x | {"ranks": w} for w, xs in t["worlds"].items() for x in xs],
    )


def fullbatch_plan(r: dict) -> str:
    t = r["padding"]["padding"]["budget"]
    return columns(
        "budget=budget:, | K=k | plan at 8 ranks, before (s)=plan_s.before:.3f"
        " | after (s)=plan_s.after:.3f | steps of epochs 0, 1, 2=epochs",
        [t | {"epochs": _list(t["epochs"], ",")}],
    )


def hf_fidelity(r: dict) -> str:
    hf = r["padding"]["padding"]["hf_fidelity"]
    return columns(
        "ranks=world_size | samples per rank=per_device | simulated=simulated:.4f"
        " | real (Distributed)LengthGroupedSampler=real:.4f"
        " | real BatchRebalanceSampler=rebalance:.4f | its samples (a prefix)=rebalance_samples:,",
        [x | {"per_device": hf["per_device"]} for x in hf["rows"]],
    )


def recomposition(r: dict) -> str:
    return columns(
        "batching=label | policy=policy | mean batch=mean_batch:.1f"
        " | recomposition=recomposition:.1% | chance floor=chance_floor:.1%"
        " | repeated pairs=repeated_pairs:.3% | bucket switch rate=switch_rate:.1%"
        " | expected (independent draws)=switch_rate_expected:.1%",
        [
            x | {"label": b["label"], "policy": name(x["name"], b["auto_k"])}
            for b in r["padding"]["quality"]["recomposition"].values()
            for x in b["rows"]
        ],
    )


# ------------------------------------------------------------------ training.json


def training_setup(r: dict) -> str:
    tr = r["training"]["training"]
    m, b = tr["model"], tr["batching"]
    row = tr | {
        "config": f"`{tr['config']}`",
        "model": f"{m['n_layers']} layers, d_model {m['d_model']}, vocabulary {m['vocab_size']}",
        "batching": " ".join(f"{k}={v}" for k, v in b.items()),
        "edges": f"`{tr['team_edges_scaled']}`",
    }
    runs = [
        {"policy": name(p), "set": f"`{' '.join(o)}`"} for p, o in tr["policy_overrides"].items()
    ]
    runs.append({"policy": "every policy", "set": f"`{' '.join(tr['shared_overrides'])}`"})
    return columns(
        "config=config | model=model | samples x 1 epoch=num_samples:, | length scale=scale:.4g"
        " | max length=max_length | batching=batching | rounds=repeats"
        " | warm-up steps left out=warmup_steps_excluded | team's edges, scaled=edges",
        [row],
    ) + "\n\n" + columns("policy=policy | `--set` overrides=set", runs)  # fmt: skip


def training(r: dict) -> str:
    rows = [
        p | {"policy": name(n, p["num_buckets"]), "team": team(n)}
        | {"ratio": f"**{p['vs_sorted']:.2f}**", "rounds": _list(p["vs_sorted_all"])}
        | {"loads": _loads(p["load1_all"])}
        for n, p in r["training"]["training"]["policies"].items()
    ]  # fmt: skip
    return columns(
        "policy=policy | K=num_buckets | steps=steps | real Ktok/s=real_tokens_per_s/1e3:.1f"
        " | vs sorted=ratio | each round=rounds | steps/s=steps_per_s:.2f"
        " | wait fraction=wait_fraction:.3f | padding eff.=padding_efficiency:.3f"
        " | team measured=team | load average (1 min), each round=loads",
        rows,
    )


def training_budget(r: dict) -> str:
    tb = r["training"]["training"].get("token_budget")
    if tb is None:  # a --quick run leaves it out
        return columns("policy=policy", [{"policy": "not measured"}])
    budget = tb["batching"]["token_budget"]
    return columns(
        f"policy=policy | K=num_buckets | steps=steps | epoch in budgets of {budget:,}="
        f"tokens/{budget}:.1f | real Ktok/s=real_tokens_per_s/1e3:.1f | vs sorted=vs_sorted:.2f"
        " | padding eff.=padding_efficiency:.3f",
        [p | {"policy": name(n, p["num_buckets"])} for n, p in tb["policies"].items()],
    )


def readability(r: dict) -> str:
    tr = r["training"]["training"]
    rt, c = tr["realtext"], tr["realtext"]["corpus"]
    rows = [
        x | {"run": name(n, tr["policies"][n]["num_buckets"]), "corpus": "synthetic"}
        for n, x in tr["readability"].items()
    ]
    span = rt["bucket_mean_loss_span"]
    rows.append(
        rt["readability"]
        | {"run": f"real text ({rt['num_buckets']} buckets)", "corr": rt["bucket_loss_corr"]}
        | {"corpus": f"Python {c['python']} stdlib, {c['samples']:,} functions, byte tokens"}
        | {"span": span and f"{span[0]:.2f}-{span[1]:.2f}"}
    )
    return columns(
        "run=run | corpus=corpus | steps=steps | first left out=skipped"
        " | var Δ loss=diff_var_raw:.5f | var Δ debiased=diff_var_debiased:.5f"
        " | debiased / raw=ratio:.2f | per-bucket mean loss, second half (nats)=span"
        " | its correlation with the bucket=corr:.2f",
        rows,
    )


# ------------------------------------------------------------------ packed.json


def packed_kernel(r: dict) -> str:
    k = r["packed"]["kernel"]
    s = k["seconds"]
    names = {
        "padded": f"padded, sorted micro-batches ({k['padded_batches']}, "
        f"{k['padded_slots']:,} slots)",
        "packed": f"packed rows, per-document attention, grouped ({k['packed_rows']} rows of "
        f"{k['row_tokens']:,})",
        "packed_block_mask": "packed rows, block-diagonal mask (reference)",
    }
    return columns(
        f"batches ({k['documents']} documents, {k['real_tokens']:,} real tokens)=name"
        f" | seconds (median of {k['repeats']})=s:.3f | real Ktok/s=tps/1e3:.2f"
        " | speed vs padded=x:.2f",
        [
            {"name": label, "s": s[n], "tps": k["real_tokens_per_s"][n], "x": s["padded"] / s[n]}
            for n, label in names.items()
        ],
    )


def packed_paper(r: dict) -> str:
    t = r["packed"]["paper"]
    spec = ["batches=name"]
    for w in t["rows"][0]["by_world_size"]:
        spec += [f"token efficiency ({w})=by_world_size.{w}.token_efficiency:.3f"]
        spec += [f"max/mean rank cost ({w})=by_world_size.{w}.max_over_mean:.3f"]
        spec += [f"useful/paid ({w})=by_world_size.{w}.useful_over_paid:.3f"]
    spec += ["pair repeat=pair_repeat.rate:.2e", "chance floor=pair_repeat.chance:.2e"]
    pack = columns(
        "samples=samples:, | attention width=attention_width:, | padded: budget=budget:,"
        " | packed: rows x row tokens=rows | pack one epoch (s, median)=pack_epoch_s:.2f"
        " | each epoch (s)=each",
        [t | {"rows": f"{t['rows_per_step']} x {t['row_tokens']:,}"}
         | {"each": _list(t["pack_epoch_s_all"])}],
    )  # fmt: skip
    return columns(" | ".join(spec), t["rows"]) + "\n\n" + pack


# ------------------------------------------------------------------ delivery.json


def _rss(c: dict) -> str:
    """Feeder peak RSS (of it private) / driver peak RSS, MB."""
    if "feeder_peak_rss_bytes" not in c:
        return "not measured"
    private = c.get("feeder_peak_private_bytes")
    feeder = f"{c['feeder_peak_rss_bytes'] / MB:,.0f}"
    feeder += "" if private is None else f" ({private / MB:,.0f})"
    return f"{feeder} / {c['driver_peak_rss_bytes'] / MB:,.0f}"


def delivery(r: dict) -> str:
    rows = []
    for x in r["delivery"]["delivery"]["runs"].values():
        later = x.get("prepare_later_s")
        prep = f"{x['prepare_first_s']:.1f} / " + ("-" if later is None else f"{later:.1f}")
        rows.append(
            x | {"prep": prep if x.get("row_cache") else f"{x['prepare_wall_s']:.1f}"}
            | {"index": f"{x['index_s']:.1f} / {x['index_cached_s']:.2f}"}
            | {"gen": "cached" if x["generate_s"] == 0 else f"{x['generate_s']:.0f}"}
        )  # fmt: skip
    return columns(
        "samples=num_samples:, | tokens (M)=num_tokens/1e6:,.0f | epochs=repeats"
        " | real Mtok/s per consumer=ray_tokens_per_s_per_consumer/1e6:.1f"
        " | total=ray_tokens_per_s_total/1e6:.1f | 1-process baseline=baseline_tokens_per_s/1e6:.1f"
        " | epoch preparation (s): first / later, row cache=prep"
        " | length index cold / cached (s)=index | corpus generation (s)=gen",
        rows,
    )


def chapters(r: dict) -> str:
    d = r["delivery"]["delivery"]
    rows = [c | {"num_samples": x["num_samples"]} for x in d["runs"].values()
            for c in x.get("chapters", [])] + d.get("chapters", [])  # fmt: skip
    for c in rows:
        c["size"] = "whole epoch" if c["chapter_tokens"] is None else f"{c['chapter_tokens']:,}"
        c["rss"] = _rss(c)
    return columns(
        "samples=num_samples:, | tokens (M)=num_tokens/1e6:,.0f | chapter tokens=size"
        " | chapters=chapters | first micro-batch (s)=first_step_s:.1f | epoch (s)=epoch_s:.1f"
        " | object store peak (MB)=peak_object_store_bytes/1e6:,.0f"
        " | spilled (MB)=spilled_bytes/1e6:,.0f | feeder parts held, peak (MB)="
        "feeder_peak_held_bytes/1e6:,.0f | RSS peak feeder (private) / driver (MB)=rss",
        rows,
    )


def _times(ts: list[float]) -> str:
    if len(ts) == 1:
        return f"{ts[0]:.1f}"
    return f"{statistics.median(ts):.1f} ({min(ts):.1f}-{max(ts):.1f}, {len(ts)} runs)"


def _decodes(run: dict | None, row_groups: int) -> str:
    """Passes over the corpus decoded from parquet in a run (row groups read / row groups)."""
    if run is None or not run.get("range_reads") or not row_groups:
        return "-"
    return f"{sum(x['rg_parquet'] + x['rg_filled'] for x in run['range_reads']) / row_groups:.2f}"


def _first_step_row(x: dict) -> dict:
    c, r, w = x["cold"], x["resume"], x.get("warm")
    cached = x.get("row_cache", False)
    colds = x.get("first_step_cold_s") or [c["first_step_s"]]
    rf, reads = r["first_range"], x["reads"]
    runs = [run for run in (c, w) if run]
    mem = {k: max(run.get(k, 0) for run in runs) for k in c if k.endswith("_bytes")}
    return (x | mem | {
        "steady": w or c,  # rates from the run on the filled row cache where there is one
        "run": f"{x['chapters_run']} of {x['chapters']}",
        "empty": f"{colds[0]:.1f} ({c['first_range']['tokens']:,} tok)" if cached else "off",
        "cold": _times(colds[1:] if cached and len(colds) > 1 else colds),
        "restart": f"{_times(x.get('first_step_resume_s') or [r['first_step_s']])} "
        f"({rf['tokens']:,} tok, step {r['start_step']:,})",
        "rss": _rss(mem),
        "decodes": f"{_decodes(c, x.get('row_groups', 0))} / {_decodes(w, x.get('row_groups', 0))}",
        "cache": f"{x.get('row_cache_bytes', 0) / 1e9:.2f}" if cached else "off",
        "reads": f"{reads['chapters_amplification']:.2f}x / "
        f"{reads['with_lead_in_amplification']:.2f}x",
    })  # fmt: skip


def first_steps(r: dict) -> str:
    runs = r["delivery"]["delivery"]["first_steps"]
    return columns(
        "samples=num_samples:, | tokens (M)=num_tokens/1e6:,.0f | chapters run=run"
        " | chapter tokens=chapter_tokens:, | lead-in tokens=lead_tokens:,"
        " | index build (s)=index_build_s:.1f | first step, empty row cache (s) (first range)="
        "empty | first step cold (s)=cold | first step after restart (s)=restart"
        " | consumer Mtok/s=steady.consumer_tokens_per_s/1e6:,.0f"
        " | prep Mtok/s=steady.prepare_tokens_per_s/1e6:.1f | waiting=steady.wait_fraction:.0%"
        " | object store peak (MB)=peak_object_store_bytes/1e6:,.0f"
        " | largest range (MB)=max_range_bytes/1e6:,.0f"
        " | RSS peak feeder (private) / driver (MB)=rss | decodes cold / filled=decodes"
        " | row cache (GB)=cache | parquet reads per epoch without it: chapters / with the "
        "lead-in=reads",
        [_first_step_row(x) for x in runs],
    )
