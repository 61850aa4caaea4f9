#!/usr/bin/env bash
# One-minute check of a GPU node, inside the project image, before a multi-node job:
#   versions (Python, Ray, torch, the CUDA runtime torch was built with, cuDNN, NCCL, the NVIDIA
#   driver), the GPUs torch sees, then a two-GPU NCCL all-reduce checked for the exact sum.
# Usage:  scripts/check_node.sh [--cpu]
#   e.g. kubectl run check --rm -it --restart=Never --image=IMAGE \
#          --overrides='{"spec":{"containers":[{"name":"check","image":"IMAGE",
#            "command":["scripts/check_node.sh"],"resources":{"limits":{"nvidia.com/gpu":2}}}]}}'
#   --cpu   the same all-reduce with gloo between two CPU processes (no GPU needed): proves the
#           script itself works; the default test suite runs it (tests/unit/test_check_node.py).
# Environment: PY (python to use, default python), CHECK_TIMEOUT_S (default 120), CHECK_MIB
#   (all-reduce size per rank, default 64).
# Exit codes: 0 all good; 2 usage; 3 a driver older than torch's CUDA needs, torch sees no CUDA
#   or fewer than 2 GPUs; 4 torch has no NCCL; 5 the all-reduce failed, timed out or returned a
#   wrong sum.
set -uo pipefail

mode=nccl
case "${1:-}" in
  "") ;;
  --cpu) mode=gloo ;;
  *) echo "usage: scripts/check_node.sh [--cpu]" >&2; exit 2 ;;
esac
PY=${PY:-python}
timeout_s=${CHECK_TIMEOUT_S:-120}
mib=${CHECK_MIB:-64}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/check.py" <<'PYEOF'
import datetime, os, subprocess, sys, time

mode, role = sys.argv[1], sys.argv[2]
import torch
import torch.distributed as dist

if role == "info":
    import platform
    from importlib import metadata
    try:  # the installed version, without the seconds an `import ray` takes
        ray_v = metadata.version("ray")
    except metadata.PackageNotFoundError:
        ray_v = "not installed"
    libc = " ".join(platform.libc_ver())  # torch's manylinux_2_28 wheel needs glibc >= 2.28
    print(f"python {platform.python_version()} | {libc} | ray {ray_v} | torch {torch.__version__}")
    print(f"torch built with CUDA {torch.version.cuda} | cuDNN {torch.backends.cudnn.version()}")
    drv = []
    try:
        drv = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        ).stdout.split()
        print(f"NVIDIA driver {drv[0] if drv else 'unknown (nvidia-smi printed nothing)'}")
    except (OSError, subprocess.TimeoutExpired):
        print("NVIDIA driver unknown (no nvidia-smi)")
    # The oldest driver each CUDA major supports (minor-version compatibility).
    floor = {"12": 525, "13": 580}.get((torch.version.cuda or "").split(".")[0])
    if floor and drv and drv[0].split(".")[0].isdigit() and int(drv[0].split(".")[0]) < floor:
        print(f"FAIL: torch's CUDA {torch.version.cuda} needs NVIDIA driver >= {floor}, this node "
              f"has {drv[0]}: rebuild the image with --build-arg TORCH_CUDA=cu126 or update the "
              "driver (docs/cluster.md, CUDA: which version matters)", file=sys.stderr)
        sys.exit(3)
    if mode == "gloo":
        print(f"gloo available: {dist.is_gloo_available()} (CPU dry run: GPUs not checked)")
        sys.exit(0 if dist.is_gloo_available() else 4)
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    print(f"GPUs visible to torch: {n}")
    for i in range(n):
        print(f"  cuda:{i} {torch.cuda.get_device_name(i)}")
    if n < 2:
        print("FAIL: need at least 2 GPUs visible to torch (driver too old for the CUDA above? "
              "no nvidia.com/gpu limit on the pod?)", file=sys.stderr)
        sys.exit(3)
    if not dist.is_nccl_available():
        print("FAIL: this torch has no NCCL", file=sys.stderr)
        sys.exit(4)
    print(f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
    sys.exit(0)

rank, mib = int(role), int(os.environ["CHECK_MIB"])
device = torch.device("cuda", rank) if mode == "nccl" else torch.device("cpu")
if mode == "nccl":
    torch.cuda.set_device(device)
dist.init_process_group(mode, rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=int(os.environ["CHECK_TIMEOUT_S"])))
x = torch.full((mib * 2**20 // 4,), float(rank + 1), device=device)
dist.all_reduce(x)  # warm-up: connection set-up
x.fill_(rank + 1)
if mode == "nccl":
    torch.cuda.synchronize()
t0 = time.perf_counter()
dist.all_reduce(x)
if mode == "nccl":
    torch.cuda.synchronize()
dt = time.perf_counter() - t0
ok = bool((x == 3.0).all())
if rank == 0:
    # Bus bandwidth of a ring all-reduce over n ranks: 2 (n-1)/n x bytes / time (n = 2: 1x).
    print(f"all-reduce {mode} 2 ranks {mib} MiB: {'sum correct' if ok else 'WRONG SUM'}, "
          f"{dt * 1e3:.1f} ms, {mib / 1024 / dt:.1f} GiB/s bus bandwidth")
dist.destroy_process_group()
sys.exit(0 if ok else 5)
PYEOF

"$PY" "$work/check.py" "$mode" info
rc=$?
[ $rc -eq 0 ] || exit $rc

export MASTER_ADDR=127.0.0.1 CHECK_MIB=$mib CHECK_TIMEOUT_S=$timeout_s
MASTER_PORT=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
export MASTER_PORT
pids=()
for r in 0 1; do
  timeout "$timeout_s" "$PY" "$work/check.py" "$mode" "$r" &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do
  wait "$p" || status=$?
done
if [ $status -ne 0 ]; then
  echo "FAIL: two-rank $mode all-reduce (exit $status; 124 = timed out after ${timeout_s}s)." \
       "Rerun with NCCL_DEBUG=INFO for the transport NCCL picked." >&2
  exit 5
fi
echo "check_node: OK ($mode)"
