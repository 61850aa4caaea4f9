#!/usr/bin/env bash
# GPU smoke test, for a machine with CUDA GPUs and no network (under 5 minutes):
#   1. the GPU unit tests (tests/gpu: bf16 autocast, pinned batches, empty micro-batches);
#   2. a short bf16 training run on the synthetic corpus: NCCL DDP over every visible GPU
#      (at most 4), W&B offline, checkpoints under out/gpu_smoke.
# Usage: scripts/gpu_smoke.sh [extra --set overrides for the run]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export WANDB_MODE=${WANDB_MODE:-offline}

ngpu=$("$PY" -c "import torch; print(torch.cuda.device_count())")
if [ "$ngpu" -lt 1 ]; then
  echo "gpu_smoke: no CUDA GPU visible" >&2
  exit 1
fi
workers=$(( ngpu < 4 ? ngpu : 4 ))
echo "gpu_smoke: $ngpu GPU(s), training on $workers"

timeout 120 "$PY" -m pytest -q tests/gpu

out=out/gpu_smoke
rm -rf "$out/runs"
timeout 240 "$PY" -m jobs.train --config configs/local.yaml \
  --set scaling.use_gpu=true \
  --set scaling.num_workers="$workers" \
  --set scaling.cpus_per_worker=1 \
  --set train.bf16=on \
  --set train.max_steps=60 \
  --set batching.token_budget=65536 \
  --set data.max_length=2048 \
  --set data.synthetic.out_dir="$out/data" \
  --set checkpoint.storage_path="$out/runs" \
  --set checkpoint.run_name=gpu-smoke \
  --set checkpoint.every_steps=30 \
  "$@"
echo "gpu_smoke: OK"
