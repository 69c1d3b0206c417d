"""The helper that counts executed SASS instructions per address through CUPTI (``sass_counts.c``).

CUPTI's SASS Metrics API patches each kernel the first time it runs while counting is on and
counts, per instruction address, how often warps executed it and how many of their threads had
its predicate on. cupti-python does not bind it, so a small C library of ours does: the judge
builds it once per machine and CUDA (``build_helper``, cached like candidate builds, from the
source shipped in the package) and a count run (``ptxgym.evaluate.single_call``) loads it with
ctypes (``SassCounter``) before the candidate's library.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ptxgym import paths

WARP_METRIC = "smsp__sass_inst_executed"
"""Warp-level executions of each instruction."""
THREAD_METRIC = "smsp__sass_thread_inst_executed_pred_on"
"""Thread-level executions with the predicate on: what ran, not what was skipped."""
COUNT_METRICS = (WARP_METRIC, THREAD_METRIC)
HELPER_SOURCE = Path(__file__).with_name("sass_counts.c")
_BUILD_TIMEOUT_S = 120.0


class HelperUnavailable(RuntimeError):
    """The helper cannot be built or loaded here (no CUPTI, no compiler): counts come from
    Nsight Compute instead."""


@dataclass(frozen=True)
class CountRecord:
    """The counts of one instruction: its function's symbol, its offset in the function, and
    each metric's value."""

    function: str
    pc: int
    values: dict[str, int]


def find_cupti() -> Path | None:
    """libcupti of the CUDA toolkit (``$CUDA_HOME``, its ``extras/CUPTI``) or of an NVIDIA
    wheel; None when there is none."""
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    patterns = [
        str(home / folder / "libcupti.so*")
        for folder in ("lib64", "lib", "extras/CUPTI/lib64", "targets/*/lib")
    ]
    for entry in sys.path:
        patterns += [
            os.path.join(entry, "nvidia", "*", "lib", "libcupti.so*"),
            os.path.join(entry, "nvidia", "cuda_cupti", "lib", "libcupti.so*"),
        ]
    for pattern in patterns:
        if found := sorted(glob.glob(pattern)):
            return Path(found[0]).resolve()
    return None


@cache
def build_helper() -> Path:
    """The built helper library, compiled on first use into ptxgym's cache (keyed by the source,
    the compiler and the CUPTI it links). Raises ``HelperUnavailable`` with the reason."""
    cupti = find_cupti()
    if cupti is None:
        raise HelperUnavailable("libcupti was not found (CUDA toolkit or nvidia wheel)")
    nvcc = paths.cuda_tool("nvcc")
    if nvcc is None:
        raise HelperUnavailable("nvcc was not found to build the CUPTI helper")
    include = [f"-I{folder}" for folder in _cupti_includes(cupti)]
    source = HELPER_SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, nvcc.encode(), str(cupti).encode()])).hexdigest()
    target = paths.cache_dir() / "cupti-helper" / key[:16] / "sass_counts.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        built = Path(work) / target.name
        command = [
            nvcc,
            "-shared",
            "-O2",
            "-Xcompiler",
            "-fPIC",
            *include,
            "-o",
            str(built),
            str(HELPER_SOURCE),
            f"-L{cupti.parent}",
            f"-Xlinker=-rpath,{cupti.parent}",
            "-l:" + cupti.name,
            "-ldl",
        ]
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise HelperUnavailable(f"building the CUPTI helper failed: {exc}") from None
        if result.returncode != 0:
            tail = (result.stderr or result.stdout)[-800:]
            raise HelperUnavailable(f"building the CUPTI helper failed: {tail}")
        os.replace(built, target)  # atomic: another judge building it at once is harmless
    return target


def _cupti_includes(cupti: Path) -> list[Path]:
    """Folders that may hold cupti.h beside the library (the toolkit's include folder is nvcc's
    own)."""
    candidates = [cupti.parent.parent / "include", cupti.parent.parent.parent / "include"]
    return [folder for folder in candidates if (folder / "cupti_sass_metrics.h").is_file()]


class SassCounter:
    """The helper loaded into this process (which must have made its CUDA context current)."""

    def __init__(self, helper: Path) -> None:
        try:
            self._lib = ctypes.CDLL(str(helper))
        except OSError as exc:
            raise HelperUnavailable(f"the CUPTI helper could not be loaded: {exc}") from None
        self._lib.ptxgym_sass_error.restype = ctypes.c_char_p
        self._lib.ptxgym_sass_metric_id.restype = ctypes.c_uint64
        self._lib.ptxgym_sass_record_count.restype = ctypes.c_size_t
        self._lib.ptxgym_sass_record.argtypes = [
            ctypes.c_size_t,
            ctypes.c_uint64,
            ctypes.POINTER(ctypes.c_char_p),
            ctypes.POINTER(ctypes.c_uint32),
            ctypes.POINTER(ctypes.c_uint64),
        ]
        self.metrics: tuple[str, ...] = ()

    def _check(self, code: int) -> None:
        if code != 0:
            raise RuntimeError((self._lib.ptxgym_sass_error() or b"?").decode(errors="replace"))

    def prepare(self, device: int, metrics: tuple[str, ...] = COUNT_METRICS) -> None:
        """Set up counting of ``metrics`` on ``device`` (before any candidate code is loaded)."""
        names = (ctypes.c_char_p * len(metrics))(*(name.encode() for name in metrics))
        self._check(self._lib.ptxgym_sass_prepare(device, names, len(metrics)))
        self.metrics = metrics

    def enable(self) -> None:
        self._check(self._lib.ptxgym_sass_enable())

    def collect(self) -> list[CountRecord]:
        """Everything counted since ``enable`` (call after the work has finished)."""
        self._check(self._lib.ptxgym_sass_collect())
        ids = {name: self._lib.ptxgym_sass_metric_id(i) for i, name in enumerate(self.metrics)}
        records = []
        function, pc, value = ctypes.c_char_p(), ctypes.c_uint32(), ctypes.c_uint64()
        for index in range(self._lib.ptxgym_sass_record_count()):
            values = {}
            for name, metric_id in ids.items():
                self._check(
                    self._lib.ptxgym_sass_record(
                        index,
                        metric_id,
                        ctypes.byref(function),
                        ctypes.byref(pc),
                        ctypes.byref(value),
                    )
                )
                values[name] = value.value
            symbol = (function.value or b"").decode(errors="replace")
            records.append(CountRecord(symbol, pc.value, values))
        return records

    def disable(self) -> None:
        self._check(self._lib.ptxgym_sass_disable())
