"""BENCHMARKS.md's tables, and the README's headline tables, rendered from the benchmarks' JSON.

    python -m bench.tables [--md BENCHMARKS.md] [--readme README.md] [--dir benchmarks]

Tables only: the prose around them is written by hand, and holds no figure. Each table sits in a
block between `<!-- NAME:start -->` and `<!-- NAME:end -->` (`replace_block`); a block's content
is replaced, its markers and everything outside them are kept. `BLOCKS` names each block of
BENCHMARKS.md, the JSON files it reads (`benchmarks/<name>.json`, written by
`python -m bench.<name>`) and its table (`bench.table_blocks`, `bench.outcome_blocks`);
`README_BLOCKS` the README's. The `<name>-ran` blocks say which command, machine and date each
JSON comes from.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from pathlib import Path

from bench import gpu_blocks as gb
from bench import outcome_blocks as ob
from bench import table_blocks as tb
from bench import window_cluster as wc
from bench import windows as bw
from bench.outcome import speed_vs_sorted
from bench.table_blocks import columns, ran_on

__all__ = ["BLOCKS", "GOALS", "README_BLOCKS", "load_results", "main", "render", "replace_block"]

README_HEADLINE = "bench:headline"  # the README's blocks
README_OUTCOME = "outcome:headline"
# The goals the library was built against.
GOALS = {
    "vs_sorted": 0.93,  # bucketed real tokens/s (and padding) at least this share of sorted's
    "recomposition": 0.01,  # micro-batches repeating a pair of the last epoch: below this
    "readability": 0.5,  # real text: var of step-to-step change, debiased / raw, at most this
    "packed_vs_sorted": 1.00,  # packed rows' real tokens/s against sorted-static's, CPU steps
    "pack_s": 2.0,  # seconds to pack one epoch of the preset
}


def headline(r: dict) -> str:
    pad = r["padding"]["padding"]
    b32 = pad["batchings"]["B32"]
    recomp = {x["name"]: x for x in r["padding"]["quality"]["recomposition"]["B32"]["rows"]}
    trained = r["training"]["training"]["policies"]
    rows = []
    for p in b32["policies"]:
        name, t = p["name"], trained.get(p["name"])
        if name in ("optimal:6", "optimal:16", "lhotse"):
            continue  # one row per idea; the padding table has them all
        label = tb.name(name, b32["auto"]["k"])
        k = f" (K={t['num_buckets']})" if t and name == "optimal:auto" else ""
        rows.append(
            recomp.get(name, {})
            | {
                "policy": f"**{label}**" if name == "optimal:auto" else label,
                "padding": p["vs_sorted"],
                "train": "not trained" if t is None else f"{t['vs_sorted']:.2f}{k}",
                "team": tb.team(name),
            }
        )
    return columns(
        f"policy=policy | padding eff. vs sorted ({pad['samples'] / 1000:.0f}K, B=32)=padding:.3f"
        " | train real tok/s vs sorted (CPU)=train | team measured tok/s vs sorted=team"
        " | recomposition e0→e1 (B=32)=recomposition:.1% | repeated pairs (B=32)=repeated_pairs:.3%",
        rows,
    )


def goals(r: dict) -> str:
    pad = {p["name"]: p for p in r["padding"]["padding"]["batchings"]["B32"]["policies"]}
    auto = {x["name"]: x for x in r["padding"]["quality"]["recomposition"]["B32"]["rows"]}
    auto = auto["optimal:auto"]
    tr, g = r["training"]["training"], GOALS
    packed = r["packed"]
    packed_speed, _ = speed_vs_sorted(r["outcome"]["throughput"]["packed"])
    ratio = tr["realtext"]["readability"]["ratio"]
    rows = [  # (goal, target, measured, met)
        ("bucketed (auto) real tokens/s / sorted-static's, CPU training", f"≥ {g['vs_sorted']}",
         tr["policies"]["optimal:auto"]["vs_sorted"], ".2f", lambda x: x >= g["vs_sorted"]),
        ("bucketed (auto) padding efficiency / sorted-static's, preset, B=32",
         f"≥ {g['vs_sorted']}", pad["optimal:auto"]["vs_sorted"], ".3f",
         lambda x: x >= g["vs_sorted"]),
        ("micro-batches repeating a pair, auto edges, B=32 (its chance floor: "
         f"{auto['chance_floor']:.1%})", f"< {g['recomposition']:.0%}", auto["recomposition"],
         ".1%", lambda x: x < g["recomposition"]),
        ("loss readability on real text, var Δ debiased / raw", f"≤ {g['readability']}", ratio,
         ".2f", lambda x: x <= g["readability"]),
        ("packed rows' real tokens/s / sorted-static's, CPU training steps (outcome)",
         f"≥ {g['packed_vs_sorted']:.2f}", packed_speed, ".2f",
         lambda x: x >= g["packed_vs_sorted"]),
        ("seconds to pack one epoch of the preset", f"≤ {g['pack_s']:g}",
         packed["paper"]["pack_epoch_s"], ".2f", lambda x: x <= g["pack_s"]),
    ]  # fmt: skip
    return columns(
        "goal=goal | target=target | measured=measured | met=met",
        [
            {"goal": a, "target": b, "measured": format(x, f), "met": "yes" if ok(x) else "no"}
            for a, b, x, f, ok in rows
        ],
    )


def replace_block(markdown: str, block: str, name: str) -> str:
    """`markdown` with the text between the `name` markers replaced by `block`; the start marker
    may carry a note (`<!-- name:start (written by make bench) -->`), kept as it is."""
    start = re.search(rf"<!-- {re.escape(name)}:start(?: [^>]*)? -->", markdown)
    end = markdown.find(f"<!-- {name}:end -->", start.end() if start else 0)
    if start is None or end < 0:
        raise ValueError(f"no <!-- {name}:start --> ... <!-- {name}:end --> block to replace")
    return f"{markdown[: start.end()]}\n{block.strip()}\n{markdown[end:]}"


# ------------------------------------------------------------------ blocks

HEADLINE = ("padding", "training")
PACKED = ("packed",)
OUTCOME = ("outcome",)
BLOCKS: dict[str, tuple[tuple[str, ...], Callable[[dict], str]]] = {
    "headline": (HEADLINE, lambda r: headline_with_sources(r)),
    "goals": (HEADLINE + PACKED + OUTCOME, goals),
    "outcome-ran": (OUTCOME, ob.ran),
    "outcome-optimisation": (OUTCOME, ob.optimisation),
    "outcome-time": (OUTCOME, ob.time),
    "padding-ran": (("padding",), lambda r: ran_on("padding", r["padding"]["meta"])),
    "padding": (("padding",), tb.padding),
    "planning": (("padding",), tb.planning),
    "fullbatch": (("padding",), tb.fullbatch),
    "fullbatch-plan": (("padding",), tb.fullbatch_plan),
    "hf-fidelity": (("padding",), tb.hf_fidelity),
    "recomposition": (("padding",), tb.recomposition),
    "training-ran": (("training",), lambda r: ran_on("training", r["training"]["meta"])),
    "training-setup": (("training",), tb.training_setup),
    "training": (("training",), tb.training),
    "training-budget": (("training",), tb.training_budget),
    "readability": (("training",), tb.readability),
    "packed-ran": (PACKED, lambda r: ran_on("packed", r["packed"]["meta"])),
    "packed-kernel": (PACKED, tb.packed_kernel),
    "packed-paper": (PACKED, tb.packed_paper),
    "gpu-ran": (("gpu",), lambda r: ran_on("gpu", r["gpu"]["meta"])),
    "gpu-steps": (("gpu",), gb.steps),
    "gpu-goals": (("gpu",), gb.goals),
    "gpu-first-run": (("gpu_first_run",), lambda r: gb.first_run(r["gpu_first_run"])),
    "delivery-ran": (("delivery",), lambda r: ran_on("delivery", r["delivery"]["meta"])),
    "delivery": (("delivery",), tb.delivery),
    "chapters": (("delivery",), tb.chapters),
    "first-steps": (("delivery",), tb.first_steps),
    "windows-ran": (("windows",), lambda r: ran_on("windows", r["windows"]["meta"])),
    "windows": (("windows",), bw.table),
    "window-cluster": (("window_cluster",), lambda r: window_cluster(r["window_cluster"])),
}
README_BLOCKS = {
    README_HEADLINE: (HEADLINE, lambda r: headline_with_sources(r)),
    README_OUTCOME: (OUTCOME, ob.headline),
}


def window_cluster(r: dict) -> str:
    """The simulated cluster's table (`bench.window_cluster`) and the commands that measured it."""
    m = r["meta"]["machine"]
    ran = {
        "command": "; ".join(f"`{c}`" for c in r["meta"]["commands"]),
        "machine": f"{m.get('cpu')}, {m.get('cores')} cores, {m.get('ram_gib')} GiB RAM",
        "ray": m.get("ray"),
        "git": f"{m.get('git_commit')}" + " (uncommitted changes)" * bool(m.get("git_dirty")),
    }
    ran_table = columns("measured by=command | machine=machine | Ray=ray | git=git", [ran])
    return wc.render(list(r["sizes"].values())) + "\n\n" + ran_table


def headline_with_sources(r: dict) -> str:
    """The headline table and where its figures come from (also the README's block)."""
    return headline(r) + "\n\n" + columns(
        "figures=name | measured on=date_utc | machine=machine.cpu | cores=machine.cores"
        " | GPU=gpu | details=details | rerun with=rerun",
        [
            r[n]["meta"] | {"name": n, "rerun": f"`{tb.rerun(n)}`", "details": "[BENCHMARKS.md](BENCHMARKS.md)"}
            | {"gpu": r[n]["meta"]["machine"].get("gpu") or "none"}
            for n in HEADLINE
        ],
    )  # fmt: skip


def load_results(folder: str | Path, names) -> dict:
    """`{name: benchmarks/<name>.json}`; a missing file is an error naming the command that
    writes it."""
    out = {}
    for name in sorted(set(names)):
        path = Path(folder) / f"{name}.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found: run `python -m bench.{name} --out {path}` (`make bench` runs "
                "every benchmark), then render again"
            )
        out[name] = json.loads(path.read_text())
    return out


def render(markdown: str, results: dict, blocks: dict | None = None) -> str:
    """`markdown` with every block of `blocks` (default `BLOCKS`) rendered from `results`."""
    for name, (_, fn) in (BLOCKS if blocks is None else blocks).items():
        markdown = replace_block(markdown, fn(results), name)
    return markdown


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.tables", description=__doc__.splitlines()[0])
    p.add_argument("--md", default="BENCHMARKS.md", help="the document (default %(default)s)")
    p.add_argument("--readme", help="also its headline blocks, e.g. README.md")
    p.add_argument("--dir", default="benchmarks", help="the JSON files (default %(default)s)")
    args = p.parse_args(argv)
    try:
        results = load_results(args.dir, [n for files, _ in BLOCKS.values() for n in files])
        texts = {args.md: render(Path(args.md).read_text(), results)}  # all rendered first
        if args.readme:
            texts[args.readme] = render(Path(args.readme).read_text(), results, README_BLOCKS)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"python -m bench.tables: error: {err}") from None
    for path, text in texts.items():
        Path(path).write_text(text)
    print(
        f"bench.tables: {len(BLOCKS)} blocks in {args.md}" + (" and the README" * bool(args.readme))
    )


if __name__ == "__main__":
    main()
