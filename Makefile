# Every target sets up the project .venv on first use (pip takes torch 2.13.0 from the local CPU wheel).
PY      := .venv/bin/python
STAMP   := .venv/.installed
CONFIG  ?= configs/local.yaml

.PHONY: setup demo test test-slow test-all bench bench-render bench-outcome bench-sizing lint report gpu-check gpu-smoke clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

## Train the embedded default locally: real text, 2 CPU workers, W&B offline; ends in the run's picture.
demo: $(STAMP)
	WANDB_MODE=$${WANDB_MODE:-offline} $(PY) -m jobs.train --config $(CONFIG)

## Default test suite (unit + local Ray): at most 10 minutes on 2 cores.
test: $(STAMP)
	WANDB_MODE=disabled $(PY) -m pytest -q -m "not slow" --durations=10

## The slow suites (fault injection, job submission, whole runs); CI runs them after `make test`.
test-slow: $(STAMP)
	WANDB_MODE=disabled $(PY) -m pytest -q -m slow --durations=10

## Everything: the default suite, then the slow one.
test-all: test test-slow

## Benchmarks: each question's script writes benchmarks/<question>.json and its plots (hours on
## 2 cores, Ray for training, packed rows and delivery), then bench-render writes BENCHMARKS.md's
## tables and the README's headline from that JSON; then the feeder's sizing.
BENCH_QUESTIONS := padding training packed delivery windows window_cluster
bench: $(STAMP)
	for q in $(BENCH_QUESTIONS); do \
		WANDB_MODE=disabled $(PY) -m bench.$$q --out benchmarks/$$q.json || exit 1; \
	done
	$(MAKE) bench-render
	$(MAKE) bench-sizing

## BENCHMARKS.md's tables and the README's headline blocks from benchmarks/*.json (seconds, no run).
bench-render: $(STAMP)
	$(PY) -m bench.tables --md BENCHMARKS.md --readme README.md

## Held-out loss per batching policy (hours on 2 cores) and its plot, then every table.
bench-outcome: $(STAMP)
	WANDB_MODE=disabled $(PY) -m bench.outcome --out benchmarks/outcome.json
	$(MAKE) bench-render

## How far one feeder goes: 0.9M and 2M samples (minutes each), 9M with SIZING_9M=1 (43 GB of row cache plus the corpus).
bench-sizing: $(STAMP)
	WANDB_MODE=disabled $(PY) -m jobs.sizing $(if $(filter 1,$(SIZING_9M)),--with-9m,)

## Bucket report on the seed-calibrated 902,087-sample preset.
report: $(STAMP)
	$(PY) -m jobs.plan_buckets --preset seed902k --num-buckets auto --json out/report.json --png out/report.png

## On a GPU machine, with its own Python and torch (no venv, no Ray, no registry: missing packages
## come from .whl/, see scripts/gpu_check.sh --fetch-wheels): the GPU tests and the step benchmark.
gpu-check:
	scripts/gpu_check.sh

## On a CUDA machine with the project installed (Ray included): a short bf16 DDP run of packed rows.
gpu-smoke:
	PY=$${PY:-python3} scripts/gpu_smoke.sh

lint: $(STAMP)
	$(PY) -m ruff check pipeline bench jobs tests examples
	$(PY) -m ruff format --check pipeline bench jobs tests examples

clean:
	rm -rf .venv .pytest_cache .ruff_cache out
