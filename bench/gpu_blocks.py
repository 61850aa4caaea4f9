"""The GPU step benchmark's tables (benchmarks/gpu.json, written by `python -m bench.gpu`): the
steps per model and policy, and the goals the first GPU run is held to.

    python -m bench.gpu_blocks out/gpu_check/gpu.json    # print both tables (scripts/gpu_check.sh)
"""

from __future__ import annotations

import json
import sys

from bench.table_blocks import columns, ran_on

__all__ = ["GPU_GOALS", "first_run", "goal_rows", "goals", "steps"]

# On one GPU at the seed902k preset's lengths, at equal real tokens per step.
GPU_GOALS = {
    "packed_vs_auto": 1.08,  # packed rows' real tokens/s over padded auto-edge buckets'
    "packed_vs_sorted": 1.05,  # ... over sorted-static's
    "mfu": 0.40,  # the ~1B Llama's MFU in packed mode
    "wait": 0.02,  # share of step time waiting for data, every policy
    "syncs": 1.0,  # host-device synchronisations per optimizer step, every policy
}
LABELS = {
    "packed": "packed rows",
    "auto": "padded, auto-edge buckets",
    "sorted": "sorted-static",
    "random": "random",
}


def steps(r: dict) -> str:
    """One row per model and policy."""
    g = r["gpu"]
    rows = []
    for model, m in g["models"].items():
        for p, v in m["policies"].items():
            rows.append(
                v
                | {
                    "model": f"{model} ({m['params'] / 1e9:.2f}B)",
                    "policy": LABELS.get(p, p) + (f": {v['error']}" if "error" in v else ""),
                    "ktok": (v.get("real_tokens_per_s") or 0) / 1e3 or None,
                    "vs": m.get("packed_vs", {}).get(p),
                }
            )
    return columns(
        "model=model | policy=policy | buckets=buckets | real tok/step=real_tokens_per_step:.0f"
        " | fill=fill:.3f | step s=step_s:.3f | real Ktok/s=ktok:.1f | packed's speed over it=vs:.2f"
        " | TFLOP/s=tflops:.0f | MFU=mfu:.1% | peak GiB=peak_memory_gib:.1f"
        " | data wait=wait_fraction:.2% | syncs/step=syncs_per_step:.1f",
        rows,
    )


def first_run(g: dict) -> str:
    """The first GPU run's steps (before the GPU review's fixes), and where it ran."""
    return steps({"gpu": g}) + "\n\n" + ran_on("gpu", g["meta"])


def goal_rows(g: dict) -> list[dict]:
    """Each goal, its target and what was measured (None where it could not be: no GPU)."""
    G, rows = GPU_GOALS, []
    for model, m in g["models"].items():
        pol = m["policies"]
        vs = m.get("packed_vs", {})
        rows += [
            {"goal": f"{model}: packed real tok/s / auto-edge buckets'", "target": f"≥ {G['packed_vs_auto']}",
             "value": vs.get("auto"), "fmt": ".2f", "ok": lambda x: x >= G["packed_vs_auto"]},
            {"goal": f"{model}: packed real tok/s / sorted-static's", "target": f"≥ {G['packed_vs_sorted']}",
             "value": vs.get("sorted"), "fmt": ".2f", "ok": lambda x: x >= G["packed_vs_sorted"]},
            {"goal": f"{model}: worst data wait share", "target": f"< {G['wait']:.0%}",
             "value": max((v.get("wait_fraction", 1) for v in pol.values()), default=None),
             "fmt": ".2%", "ok": lambda x: x < G["wait"]},
            {"goal": f"{model}: most syncs per optimizer step", "target": f"≤ {G['syncs']:.0f}",
             "value": max((v.get("syncs_per_step") or 0 for v in pol.values()), default=None)
             if any(v.get("syncs_per_step") is not None for v in pol.values()) else None,
             "fmt": ".1f", "ok": lambda x: x <= G["syncs"]},
        ]  # fmt: skip
        if "llama" in model:
            rows.append(
                {"goal": f"{model}: MFU, packed", "target": f"≥ {G['mfu']:.0%}",
                 "value": pol.get("packed", {}).get("mfu"), "fmt": ".1%",
                 "ok": lambda x: x >= G["mfu"]}
            )  # fmt: skip
    for row in rows:
        v = row["value"]
        row["met"] = "n/a (no GPU)" if v is None else ("yes" if row["ok"](v) else "**no**")
        row["measured"] = "n/a" if v is None else format(v, row["fmt"])
    return rows


def goals(r: dict) -> str:
    return columns("goal=goal | target=target | measured=measured | met=met", goal_rows(r["gpu"]))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m bench.gpu_blocks GPU_JSON", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        r = {"gpu": json.load(f)}
    print(steps(r))
    print()
    print(goals(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
