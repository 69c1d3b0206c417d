"""Least privilege for the processes that run candidate code (the worker, the single-call runs).

- A scrubbed environment: only what CUDA, Python and the tools need (PATH, the library path,
  CUDA_*/NVIDIA_* settings, the Python path, locale). Nothing else reaches candidate code: no
  tokens, credentials or cache paths of the user, neither through getenv nor through
  /proc/self/environ (the block the process started with is zeroed). HOME and TMPDIR point at
  the process's own temporary folder, which is also its working directory. CPU thread pools
  (OpenMP, OpenBLAS, MKL) get one thread: the work is on the GPU.
- Resource limits: at most 64 MiB to any file (a printf flood ends the process instead of
  filling the disk) and no core files.
- No network where the OS allows it: the worker unshares its network namespace (this needs
  CAP_SYS_ADMIN, e.g. root on a GPU host; without it the worker keeps the host's network, which
  the build's host-call allow-list already keeps candidates from using). The single-call
  processes cannot: Nsight Compute and compute-sanitizer talk to the program they run over
  local sockets.
- A seccomp filter (``ptxgym.sandbox.seccomp``), installed once CUDA is up and before the
  candidate's
  library is loaded: no new processes or programs, no signals to other processes, no tracing,
  and in the worker no sockets but ``AF_UNIX``.
- Files confined (``ptxgym.sandbox.landlock``), where the kernel has Landlock: writes only in the
  process's own folder, /dev/shm and device files; reads only of the system, Python and its
  packages, ptxgym's own code, the CUDA driver's and the tools' files, and the process's own
  folder (``readable_paths``): not the user's home, the project, ptxgym's cache (other
  candidates' sources and libraries, baselines, the judge's key) or other processes' /proc.
  In the worker from before CUDA starts (so the driver's threads, which run host callbacks, are
  confined too); in the single-call processes once CUDA is up. Where the kernel also scopes
  abstract Unix sockets (Landlock ABI 6), the worker cannot reach one made outside its domain:
  Python's forkserver, unconfined, listens on one.

docs/security.md lists what this does not cover.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import resource
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from ptxgym import paths
from ptxgym.sandbox import landlock
from ptxgym.sandbox.processes import stat_fields
from ptxgym.sandbox.seccomp import SeccompUnavailable, restrict_system_calls

MAX_FILE_BYTES = 64 << 20
_KEPT_NAMES = frozenset(
    {
        "PATH",
        "LD_LIBRARY_PATH",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONUNBUFFERED",
        "VIRTUAL_ENV",
        "LANG",
        "LC_ALL",
        "CUDA_HOME",
        "CUDA_PATH",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_MODULE_LOADING",
        "CUDA_DEVICE_ORDER",
    }
)
_KEPT_PREFIXES = ("NVIDIA_", "CUDA_", "NCCL_", "TORCH_SYMM_MEM_", "NVSHMEM_")
# Candidate processes compute on the GPU, not with CPU thread pools. With a pool per core, the
# pools of OpenMP (torch) and OpenBLAS (numpy) spun while Python imported them: on the H200
# host's 16 cores, 5.3 CPU-seconds to import torch against 3.2 with one thread, and 3.1 against
# 1.0 to import ptxgym (docs/benchmarks.md, tenth session), paid by every process started with
# this environment (tool runs, the report reader). A forked worker has its imports from the
# forkserver, which imported them under the judge's environment.
_ONE_CPU_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def scrubbed_environment(folder: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) cut to what candidate processes need, with
    HOME and TMPDIR at ``folder``."""
    source = dict(os.environ) if base is None else base
    kept = {
        name: value
        for name, value in source.items()
        if name in _KEPT_NAMES or name.startswith(_KEPT_PREFIXES)
    }
    return {**kept, **_ONE_CPU_THREAD, "HOME": str(folder), "TMPDIR": str(folder)}


def python_environment(folder: Path, extra_path: Path | None = None) -> dict[str, str]:
    """The scrubbed environment for a Python program of ptxgym's started in ``folder`` (a tool
    run, the report reader): ptxgym's own import root (and ``extra_path``) first on the Python
    path, so it imports the same ptxgym whether installed or run from a checkout."""
    environment = scrubbed_environment(folder)
    roots = [str(paths.import_root())]
    roots += [str(extra_path)] if extra_path is not None else []
    roots += [environment["PYTHONPATH"]] if environment.get("PYTHONPATH") else []
    return {**environment, "PYTHONPATH": os.pathsep.join(roots)}


def confine(
    folder: Path, programs: Sequence[Path] | None = None, extra_readable: Sequence[Path] = ()
) -> dict[str, bool]:
    """Confine this process before it loads candidate code: scrubbed environment, ``folder`` as
    working directory, file-size and core limits, its own network namespace when allowed, and
    writes only beneath ``folder`` where the kernel has Landlock (and with ``programs``, no
    program run but those files; ``extra_readable`` readable besides ``readable_paths``, e.g. the
    lock folder a spec names). Returns which of the optional steps took effect."""
    folder.mkdir(parents=True, exist_ok=True)
    # Before the scrub: it reads settings (PTXGYM_LOCK_DIR, CUDA_HOME).
    readable = [*readable_paths(), *extra_readable]
    environment = scrubbed_environment(folder)
    for name in list(os.environ):
        del os.environ[name]  # unsetenv: the C library's environ changes too
    os.environ.update(environment)  # putenv: fresh strings, none in the initial block
    _erase_initial_environment()
    os.chdir(folder)
    limit_resources()
    network_isolated = _unshare_network()
    files_confined = restrict_files(folder, readable, scope_sockets=True, programs=programs)
    return {
        "network_isolated": network_isolated,
        "writes_confined": files_confined,
        "reads_confined": files_confined,
    }


def seal(network: bool, processes: bool = False) -> bool:
    """Install the seccomp filter (``network=False``: no sockets but AF_UNIX; ``processes=True``:
    new processes and programs still allowed, for a compile run) on every thread of this
    process. Call it after CUDA is initialised (the driver may start helpers on the way) and
    before candidate code is loaded. False, with the reason on stderr (the process's log), where
    the system has no libseccomp or the kernel refuses filters."""
    try:
        restrict_system_calls(network, processes)
    except SeccompUnavailable as exc:
        print(f"ptxgym: no seccomp filter: {exc}", file=sys.stderr, flush=True)
        return False
    return True


def restrict_files(
    folder: Path,
    readable: list[Path] | None = None,
    *,
    scope_sockets: bool = False,
    programs: Sequence[Path] | None = None,
) -> bool:
    """From now on, in this thread and all it starts: write only beneath ``folder``, in /dev/shm
    and to device files; read only beneath ``folder`` and ``readable`` (default:
    ``readable_paths()``); with ``programs``, run no program but those files;
    with ``scope_sockets``, connect to no abstract Unix socket made outside. False, with the
    reason on stderr, where the kernel has no Landlock. (/dev/shm: shared-memory segments, which
    the profiler's and the sanitizer's in-process parts may make to talk to their front ends; no
    trusted process reads it.)"""
    shared_memory = Path("/dev/shm")
    try:
        landlock.confine(
            writable=[folder, *([shared_memory] if shared_memory.is_dir() else [])],
            readable=readable_paths() if readable is None else readable,
            executable=programs,
            scope_abstract_sockets=scope_sockets,
        )
    except (landlock.LandlockUnavailable, OSError) as exc:
        print(f"ptxgym: files not confined: {exc}", file=sys.stderr, flush=True)
        return False
    return True


# What a process running candidate code reads besides its own folder: the system's programs,
# libraries and data (CUDA's driver library among them), device and system information, its own
# /proc entries, and a few files of /etc that the C library and the driver open.
_SYSTEM_READABLE = (
    *landlock.SYSTEM_PROGRAMS,
    *landlock.LOADER_FILES,
    "/opt",
    "/sys",
    "/dev",
    "/proc/self",
    "/proc/thread-self",
    "/proc/driver/nvidia",
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/proc/stat",
    "/proc/sys",
    "/proc/filesystems",
    "/proc/modules",
    "/proc/devices",
    "/run/nvidia-persistenced",
    "/var/run/nvidia-persistenced",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/host.conf",
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/os-release",
    "/etc/nvidia",
    "/etc/OpenCL",
)


def readable_paths() -> list[Path]:
    """What a confined process may read besides its own folder: ``_SYSTEM_READABLE``; Python,
    its standard library and installed packages (the module path's folders under Python's
    prefixes, named site-packages, or named in PYTHONPATH, as wheels carried to a GPU host
    are); ptxgym's own packages (``ptxgym``, ``kernels_ref``); the CUDA toolkit and the tools
    (``CUDA_HOME``, Nsight Compute, compute-sanitizer); and the GPU locks' folder
    (``ptxgym.device.lock``), whose files a start-up takes turns on. Never a folder that holds
    ptxgym's checkout or the user's home (a PYTHONPATH of the checkout itself, or of ``~``,
    would open the project or every file of the user's)."""
    found: list[Path] = [Path(path) for path in _SYSTEM_READABLE]
    prefixes = [
        Path(prefix).resolve()
        for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    ]
    # ptxgym's checkout, where it runs from one (an editable install); installed from a wheel,
    # the folder above the package is site-packages, which must stay readable.
    above = paths.import_root()
    checkout = [above] if (above / "setup.cfg").is_file() or (above / ".git").exists() else []
    closed = [*checkout, Path.home().resolve()]
    found += [p for p in prefixes if not any(place.is_relative_to(p) for place in closed)]
    configured = {
        Path(entry).resolve()
        for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if entry
    }
    for entry in sys.path:
        folder = Path(entry).resolve() if entry else None
        if folder is None or any(place.is_relative_to(folder) for place in closed):
            continue
        if (
            folder.name in ("site-packages", "dist-packages")
            or folder in configured
            or any(folder.is_relative_to(prefix) for prefix in prefixes)
        ):
            found.append(folder)
    found.append(paths.package_dir())
    if (references := importlib.util.find_spec("kernels_ref")) and references.origin:
        found.append(Path(references.origin).resolve().parent)
    found.append(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")))
    for tool, override in (
        ("ncu", "PTXGYM_NCU"),
        ("compute-sanitizer", "PTXGYM_COMPUTE_SANITIZER"),
    ):
        if located := paths.cuda_tool(tool, override=override):
            found.append(Path(located).resolve().parent)
    found.append(paths.lock_dir())
    return [path for path in dict.fromkeys(found) if path != Path("/")]


def hand_library(library: str, folder: Path, name: str = "candidate.so") -> str:
    """A copy of a library (the candidate's, or a helper of ours) in a confined process's own
    ``folder``, the only folder of ptxgym's it may read: the cache the library was built into
    holds other candidates' sources and libraries, the baselines and the judge's key."""
    copy = folder / name
    shutil.copyfile(library, copy)
    return str(copy)


def limit_resources() -> None:
    """At most 64 MiB to any file, and no core files."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _erase_initial_environment() -> None:
    """Zero the environment block the process started with. Unsetting variables changes only the
    C library's table of pointers; the strings themselves stay where the kernel put them, and
    /proc/self/environ shows them to anyone in the process (a candidate included). Every entry
    of the table now points at strings set since (``confine`` sets each kept one again), so
    nothing uses the block any more."""
    fields = stat_fields(Path("/proc/self/stat"))
    # Fields 50 and 51 of proc(5) (env_start, env_end); the split starts at field 3.
    start, end = int(fields[47]), int(fields[48])
    if 0 < start < end:
        ctypes.memset(start, 0, end - start)


def _unshare_network() -> bool:
    unshare = getattr(os, "unshare", None)  # Python >= 3.12, Linux
    flag = getattr(os, "CLONE_NEWNET", None)
    if unshare is None or flag is None:
        return False
    try:
        unshare(flag)
    except OSError:
        return False
    return True
