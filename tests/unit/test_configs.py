"""The shipped configs load with no warning, say what they claim, and every documented `--set`
override (scripts, Makefile, README, docs, config headers, infra) loads against them."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from pipeline.core.config import TEAM_EDGES, ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(ROOT.joinpath("configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_loads_with_no_warning(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config(path)


def test_local_config_is_small_cpu_offline_and_synthetic():
    cfg = load_config(ROOT / "configs/local.yaml")
    assert not cfg.scaling.use_gpu and cfg.scaling.num_workers == 2
    assert cfg.data.path is None and cfg.data.synthetic is not None
    assert cfg.buckets.edges is None and cfg.wandb.mode == "offline"


def test_the_demo_default_is_the_measured_winner_packed_rows():
    # The outcome benchmark's winner, exactly: 8 rows of 2,048 tokens per step, auto edges
    # (one bucket in packed mode: a full shuffle packed into rows).
    for name in ("local.yaml", "local_full.yaml"):
        b = load_config(ROOT / "configs" / name).batching
        assert (b.mode, b.row_tokens, b.rows_per_step) == ("packed", 2048, 8)
        assert load_config(ROOT / "configs" / name).buckets.num_buckets == "auto"


@pytest.mark.parametrize("policy", ["sorted", "random", "megabatch", "sorted_ascending"])
def test_a_baseline_on_the_packed_default_is_refused_naming_the_padded_switch(policy):
    with pytest.raises(ConfigError) as e:
        load_config(ROOT / "configs/local.yaml", [f"plan.policy={policy}"])
    msg = str(e.value)
    assert "\n" not in msg and f"plan.policy={policy} plans padded batches" in msg
    # The switch the line names loads, with a step of the packed step's tokens.
    fix = re.findall(r"(batching\.\w+=\w+)", msg.split("add ", 1)[1])
    assert fix == ["batching.mode=token_budget", "batching.token_budget=16384"]
    cfg = load_config(ROOT / "configs/local.yaml", [f"plan.policy={policy}", *fix])
    assert cfg.plan.policy == policy and cfg.batching.token_budget == 16384


def test_team_config_matches_the_measured_run():
    cfg = load_config(ROOT / "configs/dflash_902k.yaml")
    assert cfg.buckets.edges == TEAM_EDGES == [0, 770, 1216, 1728, 2432, 3296, 8192]
    assert cfg.train.lr == 6e-4 and cfg.train.warmup_steps == 3598 and cfg.scaling.use_gpu
    # Data and checkpoints in a bucket every node sees (the synthetic stand-in is uploaded there).
    assert cfg.data.path.startswith("s3://") and cfg.data.synthetic is None
    assert cfg.checkpoint.storage_path.startswith("s3://")


def test_config_errors_are_one_line_naming_the_field():
    with pytest.raises(ConfigError) as e:
        load_config(ROOT / "configs/local.yaml", ["train.warmup_steps=10"])
    assert "\n" not in str(e.value) and "train.warmup_steps" in str(e.value)
    with pytest.raises(ConfigError, match=r"^invalid config: train.lrr: unknown field"):
        load_config(ROOT / "configs/local.yaml", ["train.lrr=1"])


# --------------------------------------------------------------- documented --set overrides

SOURCES = [
    *sorted(ROOT.glob("scripts/*.sh")),
    ROOT / "Makefile",
    ROOT / "README.md",
    *sorted(ROOT.glob("docs/*.md")),
    *CONFIGS,
    *sorted(p for p in ROOT.glob("infra/**/*") if p.suffix in (".sh", ".yaml", ".yml")),
]
# `--set a.b=VALUE`, the value up to whitespace or a line-continuation backslash.
SET = re.compile(r"--set\s+([A-Za-z_][\w]*(?:\.[\w]+)+)=(\"[^\"]*\"|'[^']*'|[^\s\\`]*)")
# Shell and placeholder values stand for a real value of the field's kind; `a.b=c` and
# `KEY=VALUE` are the syntax itself, not a field.
PLACEHOLDERS = {"$workers": "2", "$out/data": "out/data", "$out/runs": "out/runs"}
SYNTAX = {"a.b"}


def documented_overrides() -> list[tuple[str, tuple[str, ...]]]:
    """(source, the overrides of one line): a line's overrides go together."""
    found = []
    for src in SOURCES:
        for line in src.read_text().splitlines():
            group = []
            for m in SET.finditer(line):
                if m.group(1) in SYNTAX:
                    continue
                value = m.group(2).strip("\"'").rstrip(",;:)")
                value = PLACEHOLDERS.get(value, value).replace("...", "x")
                group.append(f"{m.group(1)}={value}")
            if group:
                found.append((str(src.relative_to(ROOT)), tuple(group)))
    return found


DOCUMENTED = documented_overrides()


def test_the_override_scan_finds_the_docs_and_configs():
    # scripts/gpu_smoke.sh writes its settings into a config file (it runs end to end on CPU in
    # tests/ray/test_gpu_smoke_dry.py); the bf16 values it uses must survive --set too.
    where = {src for src, _ in DOCUMENTED}
    assert {"docs/cluster.md", "configs/local.yaml"} <= where
    for value in ("on", "off", "auto"):
        assert load_config(ROOT / "configs/local.yaml", [f"train.bf16={value}"]).train.bf16 == value


@pytest.mark.parametrize(
    "src, overrides", DOCUMENTED, ids=[f"{s}:{' '.join(o)}" for s, o in DOCUMENTED]
)
def test_every_documented_override_loads(src, overrides):
    # The smoke script and README run local.yaml; cluster docs and infra submit the team config.
    base = "dflash_902k.yaml" if src.startswith(("docs/", "infra/")) else "local.yaml"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config(ROOT / "configs" / base, list(overrides))
