#!/usr/bin/env bash
# On a bare GPU host (no package registry): install the wheels carried in .whl/, then run the GPU
# tests and the benchmarks. Usage: scripts/gpu_host.sh [tests|bench|soak|all] [pytest args...]
# (soak, the 500-step hostile soak of benchmarks/soak.py, is not part of all: it takes minutes.)
# Results go to $OUT (default benchmarks/out): the pytest log and the benchmark JSON/markdown.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
shift || true

site=${PTXGYM_SITE:-/tmp/ptxgym-site}
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" .whl/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1
out=${OUT:-benchmarks/out}
mkdir -p "$out"

nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee "$out/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version())'

status=0
if [[ $what == tests || $what == all ]]; then
  python3 -m pytest -m gpu -q -p no:cacheprovider "$@" 2>&1 | tee "$out/pytest-gpu.log" || status=1
fi
if [[ $what == bench || $what == all ]]; then
  python3 benchmarks/gpu_evaluation.py --out "$out" || status=1
  python3 benchmarks/throughput.py --out "$out" | tee "$out/throughput.md" || status=1
fi
if [[ $what == soak ]]; then
  python3 benchmarks/soak.py --out "$out" | tee "$out/soak.md" || status=1
fi
exit $status
