#!/usr/bin/env bash
# The GPU check: does bucketray train the right thing, at what speed, on this machine's GPU?
# One command, under five minutes on one H200 from a bare machine, with the machine's own Python
# and torch (no venv, no Ray, no package registry; Ray is not needed: training runs through the
# Trainer's step in one process):
#   1. versions: the GPU, the driver, Python, torch and its CUDA, transformers;
#   2. tests/gpu: packed varlen attention forward and backward against the fp32 reference, the
#      Hugging Face packed paths against each document alone, fp32 steps on the GPU against the
#      same steps on the CPU, host-device synchronisations per optimizer step, bf16 numerics,
#      the per-document sums each step's sampling variance comes from;
#   3. bench.gpu: the step benchmark (a ~1B Llama and the demo's decoder scaled up, bf16, on the
#      seed902k preset's lengths; packed rows, auto-edge buckets, sorted-static and random at the
#      same real tokens per step), written to $OUT_DIR/gpu.json and summarised against the goals.
# Python packages the machine lacks (pydantic; transformers at the project's pin) are installed
# from wheels in .whl/ when that folder exists: `scripts/gpu_check.sh --fetch-wheels` downloads
# them on a machine with a registry (for Python $WHEEL_PY, default 3.12), to carry along.
# Usage: scripts/gpu_check.sh [--cpu | --fetch-wheels]
#   --cpu   the same steps at tiny sizes on the CPU (GPU tests skip themselves, the benchmark runs
#           its --tiny models): proves the script works; the default test suite runs it
#           (tests/unit/test_gpu_check.py).
# Environment: PY (default python3), OUT_DIR (default out/gpu_check), WHEEL_DIR (default .whl),
#   WHEELS (1: install the wheels even where nothing is missing), TESTS_TIMEOUT_S (180),
#   BENCH_TIMEOUT_S (300), BENCH_ARGS (extra flags for bench.gpu).
# Exit codes: 0 all good (performance goals are reported, not enforced); 2 usage; 3 no CUDA GPU
#   visible (without --cpu); 4 a package is missing; 5 a GPU test failed; 6 the benchmark failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT_DIR=${OUT_DIR:-out/gpu_check}
mode=gpu
case "${1:-}" in
  "") ;;
  --cpu) mode=cpu ;;
  --fetch-wheels)
    # What the GPU image may lack, at the versions this project is tested with.
    pins=$(.venv/bin/python - <<'PYEOF'
from importlib import metadata
names = ["pydantic", "pydantic_core", "annotated-types", "typing-inspection",
         "typing_extensions", "transformers"]
print(" ".join(f"{n}=={metadata.version(n)}" for n in names))
PYEOF
) || { echo "gpu_check: --fetch-wheels reads the pins from .venv: run make setup first" >&2; exit 4; }
    plat=""
    for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
      plat="$plat --platform $p"
    done
    # shellcheck disable=SC2086
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${WHEEL_PY:-3.12}" \
      --implementation cp $plat -d .whl $pins || exit 4
    echo "gpu_check: wheels in .whl/ ($(du -sh .whl | cut -f1)): $pins"
    exit 0 ;;
  *) echo "usage: scripts/gpu_check.sh [--cpu | --fetch-wheels]" >&2; exit 2 ;;
esac
mkdir -p "$OUT_DIR"
path="$PWD"
export WANDB_MODE=disabled PYTHONUNBUFFERED=1
# Padded batches change shape every step: let the caching allocator grow segments in place.
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}

# The wheels are installed where a package is missing, or always with WHEELS=1 (to train with the
# project's pinned transformers rather than the image's).
wheels=${WHEEL_DIR:-.whl}
if ls "$wheels"/*.whl >/dev/null 2>&1 && { [ "${WHEELS:-0}" = 1 ] || ! "$PY" -c "import pydantic" 2>/dev/null; }; then
  site=${WHEEL_SITE:-/tmp/bucketray-site}
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "$wheels"/*.whl || {
    echo "gpu_check: installing $wheels/ failed: wheels for another Python or platform? fetch" \
      "them again for this one (WHEEL_PY=X.Y scripts/gpu_check.sh --fetch-wheels)" >&2
    exit 4
  }
  path="$path:$site"
fi
export PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}"

echo "== gpu_check ($mode): versions"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
  || echo "no nvidia-smi"
"$PY" - "$mode" <<'PYEOF' || exit $?
import platform, sys
missing = []
for name in ("torch", "numpy", "pyarrow", "pydantic", "yaml", "transformers", "pytest"):
    try:
        __import__(name)
    except ImportError:
        missing.append(name)
if missing:
    print(f"gpu_check: missing Python packages {missing}: carry them as wheels in .whl/ "
          "(scripts/gpu_check.sh --fetch-wheels on a machine with a registry)", file=sys.stderr)
    sys.exit(4)
import torch, transformers
print(f"python {platform.python_version()} | torch {torch.__version__} (CUDA {torch.version.cuda}) "
      f"| transformers {transformers.__version__}")
if sys.argv[1] == "gpu":
    if not torch.cuda.is_available():
        print("gpu_check: torch sees no CUDA GPU (scripts/gpu_check.sh --cpu runs the CPU version)",
              file=sys.stderr)
        sys.exit(3)
    print(f"GPU: {torch.cuda.get_device_name(0)}, {torch.cuda.device_count()} visible")
PYEOF

echo "== gpu_check: tests/gpu"
t0=$(date +%s)
timeout "${TESTS_TIMEOUT_S:-180}" "$PY" -m pytest -q -p no:cacheprovider -o addopts="" tests/gpu \
  -W ignore::DeprecationWarning --junitxml="$OUT_DIR/tests.xml"
rc=$?
echo "tests/gpu: exit $rc in $(( $(date +%s) - t0 )) s"
[ $rc -eq 0 ] || { echo "gpu_check: GPU tests failed (exit $rc)" >&2; exit 5; }

echo "== gpu_check: step benchmark"
bench=()
[ "$mode" = cpu ] && bench=(--tiny --rounds 1)
t0=$(date +%s)
# shellcheck disable=SC2086
timeout "${BENCH_TIMEOUT_S:-300}" "$PY" -m bench.gpu --out "$OUT_DIR/gpu.json" "${bench[@]}" \
  ${BENCH_ARGS:-}
rc=$?
echo "bench.gpu: exit $rc in $(( $(date +%s) - t0 )) s"
[ $rc -eq 0 ] || { echo "gpu_check: the step benchmark failed (exit $rc)" >&2; exit 6; }
"$PY" -m bench.gpu_blocks "$OUT_DIR/gpu.json" || exit 6
echo "gpu_check: OK ($mode)"
