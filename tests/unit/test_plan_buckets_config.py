"""jobs.plan_buckets is a thin CLI: its flags, `--config` and `--set` make one run config, and its
report is the library's for that config (the edges `resolve_edges` gives, the plan
`epoch_plan_for` makes, `pipeline.report.build`'s report), padded or packed."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from jobs.plan_buckets import main
from pipeline.core.config import load_config
from pipeline.core.epochs import epoch_plan_for, resolve_edges
from pipeline.core.synthetic import seed902k_lengths
from pipeline.report.build import build_report, packed_report

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "configs/local.yaml"


def _report(tmp_path: Path, capsys, *argv) -> dict:
    out = tmp_path / "r.json"
    rc = main([str(a) for a in [*argv, "--json", out]])
    err = capsys.readouterr().err
    assert rc == 0, err
    return json.loads(out.read_text())


def _without_timings(report: dict) -> dict:
    report = {k: v for k, v in report.items() if k not in ("timings", "source", "truncation")}
    if "packed" in report:
        report["packed"] = {k: v for k, v in report["packed"].items() if k != "pack_seconds"}
    return report


def _preset(n: int) -> list[str]:
    return [f"data.synthetic.num_samples={n}", "data.synthetic.seed=0"]


def test_the_report_of_a_config_file_with_set_is_the_librarys_report_of_that_config(
    tmp_path, capsys
):
    n = 3000
    got = _report(
        tmp_path, capsys, "--preset", "seed902k", "--num-samples", n, "--config", LOCAL,
        "--set", "buckets.num_buckets=6", "--set", "plan.seed=3",
    )  # fmt: skip
    sets = [*_preset(n), "buckets.num_buckets=6", "plan.seed=3"]
    packed = load_config(LOCAL, sets)
    assert packed.batching.mode == "packed"  # the demo packs rows: the report adds its epoch
    # and scores padded batches of a packed step's tokens against the baselines
    cfg = load_config(LOCAL, [*sets, "batching.mode=token_budget", "batching.token_budget=16384"])
    assert cfg.data.over_length == "truncate"  # the demo config cuts at its data.max_length
    lengths = np.minimum(seed902k_lengths(n, 0), cfg.data.max_length)
    want, plan = build_report(lengths, cfg)
    want["packed"] = packed_report(lengths, packed)[0]
    assert _without_timings(got) == _without_timings(want)
    assert got["chosen"]["edges"] == resolve_edges(cfg, lengths)
    assert got["world_size"] == cfg.scaling.num_workers == 2 and got["seed"] == 3
    index = SimpleNamespace(lengths=lengths, sample_ids=None)
    run_plan = epoch_plan_for(cfg, index, got["chosen"]["edges"], 0, cfg.scaling.num_workers)
    assert got["plan"]["hash"] == run_plan.summary()["hash"] == plan.summary()["hash"]
    assert got["truncation"]["top"] == cfg.data.max_length


def test_flags_set_the_fields_they_name_and_set_comes_last(tmp_path, capsys):
    n = 2000
    got = _report(
        tmp_path, capsys, "--preset", "seed902k", "--num-samples", n, "--token-budget", 16384,
        "--max-length", 2048, "--over-length", "truncate", "--world-size", 1,
        "--set", "scaling.num_workers=4",
    )  # fmt: skip
    cfg = load_config(
        None,
        [
            *_preset(n),
            "batching.token_budget=16384",
            "data.max_length=2048",
            "data.over_length=truncate",
            "scaling.num_workers=4",
        ],
    )
    lengths = np.minimum(seed902k_lengths(n, 0), 2048)
    assert got["world_size"] == 4 and got["batching"]["token_budget"] == 16384
    assert got["chosen"]["source"] == "auto"
    assert got["chosen"]["edges"] == resolve_edges(cfg, lengths)  # auto: the run's own search
    assert _without_timings(got) == _without_timings(build_report(lengths, cfg)[0])


def test_a_packed_config_reports_the_packed_epoch_the_run_would_train(tmp_path, capsys):
    n = 2000
    got = _report(
        tmp_path, capsys, "--preset", "seed902k", "--num-samples", n, "--world-size", 2,
        "--set", "batching.mode=packed", "--set", "batching.row_tokens=8192",
    )  # fmt: skip
    cfg = load_config(
        None,
        [*_preset(n), "scaling.num_workers=2", "batching.mode=packed", "batching.row_tokens=8192"],
    )
    lengths = seed902k_lengths(n, 0)
    want, plan = packed_report(lengths, cfg)
    assert got["packed"]["edges"] == resolve_edges(cfg, lengths) == [0, int(lengths.max())]
    assert got["packed"]["hash"] == plan.content_hash == want["hash"]
    # The padded part beside it scores the default padded batching on the same edges' rules.
    assert got["batching"]["mode"] == "token_budget" and got["world_size"] == 2
    # --row-tokens makes the same packed config.
    flags = _report(
        tmp_path, capsys, "--preset", "seed902k", "--num-samples", n, "--world-size", 2,
        "--row-tokens", 8192,
    )  # fmt: skip
    assert _without_timings(flags) == _without_timings(got)
