#!/usr/bin/env bash
# On a bare GPU host (no package registry): install the wheels carried in .whl/, then run the GPU
# tests and the benchmarks. Usage:
# scripts/gpu_host.sh [tests|judge-tests|reference-tests|bench|experts|soak|collection|ray|all] [args...]
# (tests = judge-tests, then reference-tests: split, each fits a host that ends a command after
# 10 minutes; ray, with .whl-ray/ carried: the Ray pool's GPU test, then benchmarks/ray_scaling.py
# given the args, e.g. `ray --trajectories 16 --no-kill --no-speedup-examples`; soak, the 500-step hostile soak of benchmarks/soak.py, is not part of all: it
# takes minutes; neither is collection, the broad task collection's references, baselines and
# category examples of tests/gpu/test_task_collection.py, whose torch.compile baselines compile
# for minutes on a cold cache.)
# Results go to $OUT (default benchmarks/out): the pytest logs and the benchmark JSON/markdown.
#
# The GPU tests start with a smoke test (one correct candidate through the judge; nothing else
# runs when it fails). Then three pytest sessions run at once, which the GPU lock makes safe
# (every timing has the GPU to itself, across processes), then the library reference checks,
# which call cuBLAS, cuDNN and FlashInfer directly, outside the lock, alone.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
shift || true

site=${PTXGYM_SITE:-/tmp/ptxgym-site}
# .whl/ holds the base set; .whl-ray/ Ray (trimmed of its Java jars) and what it needs, carried
# in calls of their own: both together exceed what one call may carry.
if compgen -G ".whl*/*.whl" >/dev/null; then
  mapfile -t wheels < <(ls .whl*/*.whl | awk -F/ '!seen[$NF]++')  # a wheel in both: once
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "${wheels[@]}"
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1
out=${OUT:-benchmarks/out}
mkdir -p "$out"

nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee "$out/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version())'

status=0
gpu_tests() {  # name, then pytest paths
  local name=$1
  shift
  python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=10 "$@" ${pytest_args[@]+"${pytest_args[@]}"} \
    >"$out/pytest-gpu-$name.log" 2>&1
}
if [[ $what == tests || $what == judge-tests || $what == all ]]; then
  pytest_args=()
  # One correct candidate through the judge first: when that fails (a platform change such
  # as a confinement CUDA refuses), nothing after it can pass, so stop and show why.
  if ! gpu_tests smoke tests/gpu/test_gpu_evaluation.py -x -k naive_gemm_passes; then
    tail -n 40 "$out/pytest-gpu-smoke.log"
    echo "== smoke failed: the other GPU tests were not run"
    exit 1
  fi
  pytest_args=("$@")
  gpu_tests evaluation tests/gpu/test_gpu_evaluation.py tests/gpu/test_gpu_profile.py tests/gpu/test_gpu_count.py \
    tests/gpu/test_gpu_sanitizer.py tests/gpu/test_expert_examples.py tests/gpu/test_timing_method.py &
  evaluation=$!
  gpu_tests hostile tests/hostile &
  hostile=$!
  gpu_tests concurrency tests/gpu/test_pack_wrappers.py tests/gpu/test_shared_judge.py \
    tests/gpu/test_concurrent_envs.py &
  concurrency=$!
  for job in $evaluation $hostile $concurrency; do wait "$job" || status=1; done
  for name in evaluation hostile concurrency; do
    echo "== $name: $(tail -n 1 "$out/pytest-gpu-$name.log")"
    grep -E "^(FAILED|ERROR)" "$out/pytest-gpu-$name.log" || true
  done
fi
if [[ $what == tests || $what == reference-tests || $what == all ]]; then
  pytest_args=("$@")
  gpu_tests references tests/gpu/test_kernels_ref.py tests/gpu/test_naive_examples.py \
    tests/gpu/test_readme_snippet.py tests/gpu/test_triton.py || status=1
  echo "== references: $(tail -n 1 "$out/pytest-gpu-references.log")"
  grep -E "^(FAILED|ERROR)" "$out/pytest-gpu-references.log" || true
fi
if [[ $what == bench || $what == all ]]; then
  python3 benchmarks/gpu_evaluation.py --out "$out" || status=1
  python3 benchmarks/throughput.py --out "$out" | tee "$out/throughput.md" || status=1
  python3 benchmarks/profile_cost.py --out "$out" | tee "$out/profile_cost.md" || status=1
  python3 benchmarks/disturbance.py --out "$out" | tee "$out/disturbance.md" || status=1
  python3 benchmarks/cpu_cost.py --out "$out" | tee "$out/cpu_cost.md" || status=1
  python3 benchmarks/agent_overlap.py --out "$out/agent_overlap" | tee "$out/agent_overlap.md" || status=1
fi
if [[ $what == collection ]]; then
  pytest_args=("$@")
  gpu_tests collection tests/gpu/test_task_collection.py || status=1
  echo "== collection: $(tail -n 1 "$out/pytest-gpu-collection.log")"
  grep -E "^(FAILED|ERROR)" "$out/pytest-gpu-collection.log" || true
fi
if [[ $what == experts || $what == all ]]; then
  # Every expert kernel, shipped and draft, through `ptxgym eval`'s settings (for `experts`, the
  # args are the benchmark's, e.g. `experts --which drafts`; `all` passes them to pytest only).
  expert_args=()
  [[ $what == experts ]] && expert_args=("$@")
  python3 benchmarks/experts.py --out "$out" ${expert_args[@]+"${expert_args[@]}"} \
    | tee "$out/experts.md" || status=1
fi
if [[ $what == ray ]]; then
  pytest_args=()  # the args are the benchmark's
  # A wheel trimmed before 8ffb7a5 lost the mode bits of Ray's own programs: say so here, not
  # as a PermissionError from deep inside ray.init.
  for program in "$site"/ray/core/src/ray/gcs/gcs_server "$site"/ray/core/src/ray/raylet/raylet; do
    if [[ -f $program && ! -x $program ]]; then
      echo "== ray: $program is not executable: make .whl-ray again (scripts/carry_wheels.sh ray)"
      exit 1
    fi
  done
  gpu_tests ray tests/evaluate/test_ray_pool.py || status=1
  echo "== ray: $(tail -n 1 "$out/pytest-gpu-ray.log")"
  python3 benchmarks/ray_scaling.py --out "$out/ray_scaling" "$@" || status=1
fi
if [[ $what == soak ]]; then
  # SOAK_MAX_SECONDS: stop and report before a time-limited host ends the run.
  python3 benchmarks/soak.py --out "$out" ${SOAK_MAX_SECONDS:+--max-seconds "$SOAK_MAX_SECONDS"} \
    | tee "$out/soak.md" || status=1
fi
exit $status
