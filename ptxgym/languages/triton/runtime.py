"""Running a Triton candidate in the judge's processes: where Triton finds its compiled kernels,
what the compile run may execute, and the entry that calls the module with torch tensors.

Triton compiles a kernel the first time it is launched with new argument types, running ptxas
and the C compiler as processes, which the worker's seccomp filter forbids. So the kernels are
compiled once, by the compile run (``ptxgym.evaluate.compile_run``), into a Triton cache; every
later process (the worker, the tool runs) gets a copy of that cache in its own folder and finds
every kernel there, compiling nothing. For that, what Triton would otherwise learn by starting a
process is given to it (``environment``), the same in every process so the cache keys agree:

- ptxas's version, part of every kernel's key: read once by the judge (``host_facts``), passed as
  ``TRITON_MOCK_PTX_VERSION``, which replaces only that lookup;
- libcuda's folder (``TRITON_LIBCUDA_PATH``), which Triton would ask ldconfig for;
- autotuning results, kept in the cache (``TRITON_CACHE_AUTOTUNING``) so the chosen configuration
  is read back instead of timed again;
- the cache's groups of files, found in their own folder (``cache.RelocatableCache``).

The launcher and utility modules Triton builds with the C compiler are keyed by the platform,
which Python reads by running ``file``: no process of ours may run it (the compile run's
executables are an allow-list, ``compiler_programs``; the others may start none), so every process
computes the same key.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ptxgym.tasks import Task

if TYPE_CHECKING:
    import torch

CACHE_FOLDER = "triton-cache"
"""The Triton cache, beside the candidate's module in every folder that holds a prepared
candidate."""
MODULE_NAME = "ptxgym_candidate"
"""The name the candidate's module is imported under, the same in every process."""
_TIMEOUT_S = 60.0
# The programs gcc runs to compile and link a shared module.
_GCC_PROGRAMS = ("cc1", "collect2", "as", "ld", "lto-wrapper")
_LIBCUDA_RE = re.compile(r"(/\S*/)libcuda\.so(?:\.\d+)*$")
# Integer views of each element size, through which a buffer of any dtype becomes a tensor.
_TYPESTR = {1: "|i1", 2: "<i2", 4: "<i4", 8: "<i8"}


class TritonUnavailable(RuntimeError):
    """Triton is not installed here, or its ptxas cannot run: no Triton candidate can be
    evaluated on this host."""


class KernelNotCompiled(RuntimeError):
    """A kernel had to be compiled during the evaluation, where nothing may be compiled."""


def triton_folder() -> Path:
    """The installed triton package's folder, found without importing it."""
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonUnavailable("triton is not installed on this host (pip install triton)")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def ptxas_path(arch: str) -> Path:
    """The ptxas Triton runs for ``arch`` (``sm_90a``): its own, ptxas-blackwell from sm_100."""
    capability = int(re.sub(r"\D", "", arch))
    name = "ptxas-blackwell" if capability >= 100 else "ptxas"
    return triton_folder() / "backends" / "nvidia" / "bin" / name


@cache
def host_facts(arch: str) -> dict[str, str]:
    """What every Triton process of an evaluation is told instead of starting a process to
    learn it, as environment variables: ptxas's version for ``arch`` and libcuda's folder. Read
    by the judge, once. Raises ``TritonUnavailable``."""
    ptxas = ptxas_path(arch)
    try:
        version = subprocess.run(
            [str(ptxas), "--version"], capture_output=True, check=True, timeout=_TIMEOUT_S
        ).stdout.decode("utf-8")
    except (OSError, subprocess.SubprocessError) as exc:
        raise TritonUnavailable(f"Triton's ptxas ({ptxas}) cannot run: {exc}") from None
    return {"TRITON_MOCK_PTX_VERSION": version, "TRITON_LIBCUDA_PATH": _libcuda_folder()}


def _libcuda_folder() -> str:
    """The folder of the CUDA driver's library this process loaded (the judge's), else the one
    the loader's cache names."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    for line in maps.splitlines():
        if found := _LIBCUDA_RE.search(line):
            return found.group(1).rstrip("/")
    try:
        listing = subprocess.run(
            ["ldconfig", "-p"], capture_output=True, text=True, timeout=_TIMEOUT_S, check=False
        ).stdout
    except OSError:
        listing = ""
    for line in listing.splitlines():
        if "libcuda.so.1" in line and "=>" in line:
            return str(Path(line.split("=>")[-1].strip()).parent)
    raise TritonUnavailable("libcuda.so.1 (the NVIDIA driver) was not found")


def environment(folder: Path, facts: Mapping[str, str]) -> dict[str, str]:
    """Triton's settings for a process whose own folder is ``folder`` (the cache is its
    ``CACHE_FOLDER``), with the judge's ``facts`` (``host_facts``)."""
    return {
        **facts,
        "TRITON_CACHE_DIR": str(folder / CACHE_FOLDER),
        "TRITON_HOME": str(folder),
        "TRITON_CACHE_AUTOTUNING": "1",
        # Only the cubins and their metadata (not every IR stage): what each process copies.
        "TRITON_STORE_BINARY_ONLY": "1",
        "TRITON_CACHE_MANAGER": "ptxgym.languages.triton.cache:RelocatableCache",
    }


@cache
def compiler_programs() -> tuple[Path, ...]:
    """The only programs the compile run may start: Triton's ptxas (both), the C compiler Triton
    builds its launchers with and the programs it runs, and their loader. As files, resolved:
    what the kernel checks when a program starts."""
    programs = [
        triton_folder() / "backends" / "nvidia" / "bin" / n for n in ("ptxas", "ptxas-blackwell")
    ]
    compiler = shutil.which("gcc") or shutil.which("clang")
    if compiler is not None:
        programs.append(Path(compiler))
        for name in _GCC_PROGRAMS:
            try:
                printed = subprocess.run(
                    [compiler, f"-print-prog-name={name}"],
                    capture_output=True,
                    text=True,
                    timeout=_TIMEOUT_S,
                    check=False,
                ).stdout.strip()
            except OSError:
                continue
            found = printed if os.path.isabs(printed) else shutil.which(printed or name)
            if found:
                programs.append(Path(found))
    resolved = [program.resolve() for program in programs if program.exists()]
    loaders = [loader for program in resolved if (loader := elf_interpreter(program))]
    return tuple(dict.fromkeys([*resolved, *loaders]))


def elf_interpreter(program: Path) -> Path | None:
    """The dynamic loader an ELF program names (PT_INTERP), resolved; None for a static one or
    what is not a 64-bit little-endian ELF file."""
    try:
        with program.open("rb") as handle:
            header = handle.read(64)
            if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
                return None
            table = int.from_bytes(header[32:40], "little")
            entry_size = int.from_bytes(header[54:56], "little")
            entries = int.from_bytes(header[56:58], "little")
            for index in range(entries):
                handle.seek(table + index * entry_size)
                entry = handle.read(entry_size)
                if int.from_bytes(entry[0:4], "little") == 3:  # PT_INTERP
                    offset = int.from_bytes(entry[8:16], "little")
                    size = int.from_bytes(entry[32:40], "little")
                    handle.seek(offset)
                    path = handle.read(size).rstrip(b"\0").decode()
                    return Path(path).resolve()
    except (OSError, UnicodeDecodeError):
        return None
    return None


class TritonEntry:
    """The candidate's module, imported from its prepared folder, and its entry function called
    with torch tensors. Buffers that are not tensors (a single-call program's own allocations)
    are wrapped without a copy. Records which cubins Triton loads (``cubins``)."""

    def __init__(
        self, library: str, task: Task, facts: Mapping[str, str], *, compiles: bool = False
    ) -> None:
        """``compiles``: this process may compile (the compile run); elsewhere a kernel that
        Triton tries to compile is reported as such (``KernelNotCompiled``)."""
        folder = Path(library).parent
        self.compiles = compiles
        # Before triton reads them: its settings are read from the environment when used.
        os.environ.update(environment(folder, facts))
        import torch
        import triton

        torch.cuda.init()  # on the context this process made: nothing of torch's starts later
        self.task = task
        self.cache = folder / CACHE_FOLDER
        self.cubins: list[str] = []
        triton.knobs.runtime.kernel_load_start_hook.add(self._loaded)
        spec = importlib.util.spec_from_file_location(MODULE_NAME, library)
        if spec is None or spec.loader is None:
            raise ImportError(f"the candidate's module cannot be loaded from {library}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[MODULE_NAME] = module  # Triton reads kernels' sources through their module
        spec.loader.exec_module(module)
        self.function = getattr(module, task.entry_point.symbol)

    def _loaded(
        self, module: Any, function: Any, name: str, group: dict[str, str], *_: Any
    ) -> None:
        """Triton's hook as it loads a kernel: the cubin's path in the cache, kept."""
        for path in group.values():
            if path.endswith(".cubin"):
                self.cubins.append(os.path.relpath(path, self.cache))

    def __call__(
        self,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, Any],
        axes: Mapping[str, int],
        stream: int,
    ) -> int:
        import torch

        definition = self.task.definition
        arguments: list[Any] = [
            self._tensor(buffers[name], spec.dtype, [axes[axis] for axis in spec.shape])
            for buffers, tensors in ((inputs, definition.inputs), (outputs, definition.outputs))
            for name, spec in tensors.items()
        ]
        arguments += [int(axes[name]) for name in self.task.entry_point.axes]
        with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
            try:
                self.function(*arguments)
            except PermissionError as exc:
                if self.compiles:
                    raise
                # The sealed process may start no program: only a compile tries to (ptxas, cc).
                raise KernelNotCompiled(
                    "a Triton kernel had to be compiled during the evaluation, which cannot "
                    f"compile ({exc}): every kernel must be launched, with the same argument "
                    "types, by the entry's first call on each workload"
                ) from None
        return 0

    @staticmethod
    def _tensor(buffer: Any, dtype: str, shape: list[int]) -> torch.Tensor:
        """``buffer`` as a contiguous tensor of ``dtype`` and ``shape`` on the current GPU."""
        import torch

        if isinstance(buffer, torch.Tensor):
            return buffer
        element = getattr(torch, dtype)
        interface = {
            "shape": tuple(shape),
            "typestr": _TYPESTR[element.itemsize],
            "data": (buffer.data_ptr(), False),
            "strides": None,
            "version": 3,
        }
        return torch.as_tensor(_DeviceArray(interface), device="cuda").view(element)


class _DeviceArray:
    """A device buffer as ``__cuda_array_interface__`` describes it, for ``torch.as_tensor``."""

    def __init__(self, interface: dict[str, Any]) -> None:
        self.__cuda_array_interface__ = interface
