#!/usr/bin/env bash
# GPU smoke test of the Ray path, for a machine with CUDA GPUs and bucketray installed with Ray
# (under 5 minutes; scripts/gpu_check.sh is the check that needs neither Ray nor a venv):
#   1. the GPU unit tests (tests/gpu);
#   2. a short bf16 training run of packed rows (the default batching) on the synthetic corpus:
#      NCCL DDP over every visible GPU (at most 4), W&B offline, checkpoints under $SMOKE_OUT
#      (default out/gpu_smoke). SMOKE_BATCHING=token_budget trains padded batches instead.
# Dry mode (--dry or DRY=1) runs step 2 on CPU so the script cannot rot unnoticed on machines
# without a GPU: no GPU tests, bf16 off, 2 gloo workers, a few steps on tiny data, its own
# local Ray instance (RAY_ADDRESS=local). The default test suite runs it
# (tests/ray/test_gpu_smoke_dry.py).
# The run's settings go into a config file written under $SMOKE_OUT, not --set flags, so their
# values keep their YAML types.
# Usage: scripts/gpu_smoke.sh [--dry] [extra --set overrides for the run]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}  # the machine's own Python: a CPU venv sees no GPU
export WANDB_MODE=${WANDB_MODE:-offline}
DRY=${DRY:-0}
if [ "${1:-}" = "--dry" ]; then
  DRY=1
  shift
fi
out=${SMOKE_OUT:-out/gpu_smoke}
rm -rf "$out/runs"
mkdir -p "$out"

if [ "$DRY" = 1 ]; then
  export RAY_ADDRESS=local
  workers=2 use_gpu=false bf16=off steps=4 budget=1024 max_length=64 samples=300 timeout_s=300
  echo "gpu_smoke: dry run on CPU, $workers gloo workers"
else
  ngpu=$("$PY" -c "import torch; print(torch.cuda.device_count())")
  if [ "$ngpu" -lt 1 ]; then
    echo "gpu_smoke: no CUDA GPU visible (scripts/gpu_smoke.sh --dry runs the CPU version)" >&2
    exit 1
  fi
  workers=$(( ngpu < 4 ? ngpu : 4 ))
  use_gpu=true bf16=on steps=60 budget=65536 max_length=2048 samples=2000 timeout_s=240
  echo "gpu_smoke: $ngpu GPU(s), training on $workers"
  timeout 120 "$PY" -m pytest -q tests/gpu
fi

cfg="$out/smoke.yaml"
"$PY" - "$cfg" "$out" "$workers" "$use_gpu" "$bf16" "$steps" "$budget" "$max_length" \
  "$samples" "$DRY" "${SMOKE_BATCHING:-packed}" <<'PYEOF'
import sys

import yaml

path, out, workers, use_gpu, bf16, steps, budget, max_length, samples, dry, mode = sys.argv[1:]
cfg = yaml.safe_load(open("configs/local.yaml"))
cfg["scaling"].update(num_workers=int(workers), use_gpu=use_gpu == "true", cpus_per_worker=1)
cfg["train"].update(bf16=bf16, max_steps=int(steps))
if mode == "packed":  # rows of the top edge, as many per step as the budget holds
    rows = max(int(workers), int(budget) // int(max_length))
    cfg["batching"] = {"mode": "packed", "row_tokens": int(max_length), "rows_per_step": rows}
    cfg["buckets"] = {"num_buckets": "auto"}
else:  # padded token-budget batches over 8 optimal buckets
    cfg["batching"] = {"mode": "token_budget", "token_budget": int(budget), "pad_to_multiple_of": 8}
    cfg["buckets"] = {"num_buckets": 8}
cfg["data"]["max_length"] = int(max_length)
cfg["data"]["synthetic"].update(preset="seed902k", out_dir=f"{out}/data", num_samples=int(samples))
cfg["checkpoint"].update(storage_path=f"{out}/runs", run_name="gpu-smoke", every_steps=30)
if dry == "1":
    cfg["scaling"]["cpus_per_worker"] = 0.5
    cfg["model"].update(vocab_size=64, d_model=32, n_layers=1, n_heads=2, d_ff=64)
    cfg["checkpoint"]["every_steps"] = 2
yaml.safe_dump(cfg, open(path, "w"), sort_keys=False)
PYEOF

timeout "$timeout_s" "$PY" -m jobs.train --config "$cfg" "$@"
echo "gpu_smoke: OK"
