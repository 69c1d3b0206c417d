#!/usr/bin/env bash
# Download, on a machine with a package registry, the wheels that scripts/gpu_host.sh installs on
# a bare GPU host that has none (its image already holds PyTorch, Triton, NumPy, CUDA's Python
# bindings, NVML's binding, matplotlib, tqdm, PyYAML, aiohttp, grpcio and the like). Usage:
#   scripts/carry_wheels.sh         # .whl/: ptxgym's own needs, CUPTI, FlashInfer, the LLM client
#   scripts/carry_wheels.sh ray     # .whl-ray/: Ray without its Java jars and the same set without
#                                   # FlashInfer, carried alone in a call of its own
# Wheels are for the GPU host's Python (3.12, x86-64), not this machine's. --no-deps throughout:
# the lists below name every package the host lacks, so nothing it already has is replaced.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-base}
folder=.whl
[[ $what == ray ]] && folder=.whl-ray

download() {  # folder, then requirements
  local folder=$1
  shift
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$folder" "$@"
}

# ptxgym's own needs, CUPTI's binding and the LLM client: every call's set.
common=(gymnasium farama-notifications 'pydantic>=2.6,<3' pydantic-core annotated-types
  typing-inspection typing-extensions idna 'cupti-python>=13.0,<13.1' pyelftools lizard radon
  'mando<0.8' openai httpx2 httpcore2 truststore jiter sniffio 'anyio>=4.10')
case $what in
  base)
    # cupti-python stays at 13.0.x: 13.4 asks for CUPTI 13.4, newer than the host's CUDA 13.0.
    # FlashInfer's decode and prefill need apache-tvm-ffi; its cuDNN and CuTe-DSL back ends,
    # which the baselines do not use, are left behind (together over 60 MB).
    download "$folder" "${common[@]}" flashinfer-python==0.6.13 apache-tvm-ffi
    ;;
  ray)
    # Ray's wheel (~79 MB) is over what one device call carries (64 MiB): its Java jars, which a
    # Python-only cluster never loads, come out, and the wheel's RECORD with them. The common
    # set comes too, without FlashInfer (its GQA baselines are not what the Ray runs time), so
    # that .whl-ray alone (about 55 MB) is a call's whole carry.
    download "$folder" 'ray>=2.40' jsonschema jsonschema-specifications referencing rpds-py \
      "${common[@]}"
    wheel=$(ls "$folder"/ray-*.whl)
    # Entries are copied, not extracted and zipped again: a copy keeps each one's mode bits,
    # and Ray's own programs (gcs_server, raylet) must stay executable once pip installs them.
    python3 - "$wheel" <<'TRIM'
import sys, zipfile
from pathlib import Path

wheel = Path(sys.argv[1])
trimmed = wheel.with_suffix(".trimmed")
with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(trimmed, "w", zipfile.ZIP_DEFLATED) as target:
    for entry in source.infolist():
        if entry.filename.startswith("ray/jars/"):
            continue
        data = source.read(entry)
        if entry.filename.endswith(".dist-info/RECORD"):
            lines = data.decode().splitlines(keepends=True)
            data = "".join(line for line in lines if not line.startswith("ray/jars/")).encode()
        target.writestr(entry, data, zipfile.ZIP_DEFLATED)
trimmed.replace(wheel)
TRIM
    ;;
  *)
    echo "usage: $0 [base|ray]" >&2
    exit 2
    ;;
esac
du -sh "$folder"
