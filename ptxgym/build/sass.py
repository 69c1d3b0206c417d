"""The static SASS inventory of a built library: opcodes per kernel, target families present.

``cuobjdump --dump-sass`` disassembles the cubin embedded in the shared library (the library is
read as a file, never loaded). Its listing has, per embedded ELF, an ``arch = sm_90a`` header and
then, per function, a ``Function : <mangled name>`` line followed by one line per instruction::

    /*03c0*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0 ;  /* 0x.. */
                                                                                  /* 0x.. */
    /*03d0*/              @!P0 S2R R3, SR_CgaCtaId ;                                      /* 0x.. */

(the second ``/* 0x.. */`` line is the rest of the 128-bit encoding). The mnemonic is the opcode
up to the first '.', after any predicate guard.

The builds are whole-program (no ``-rdc``), so every listed function is a ``__global__`` kernel:
``__noinline__`` device functions are placed inside the section of the kernel that calls them.

Static presence says what was compiled in, not what runs: it never qualifies a kernel (the runtime
profile decides); it lets feedback say "wgmma present in SASS but never executed".
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import cache
from pathlib import Path
from typing import Any

from ptxgym import paths
from ptxgym.tasks import InstructionFamily, Task

TIMEOUT_S = 60.0
_MAX_ERROR_CHARS = 300

_ARCH_RE = re.compile(r"^arch = (\S+)")
_FUNCTION_RE = re.compile(r"^\s*Function : (\S+)")
# The address field, an optional predicate guard (@P0, @!UP0, @PT), then the mnemonic; the
# encoding-only continuation lines ("/* 0x... */") have no address field and never match.
_INSTRUCTION_RE = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?\w+\s+)?([A-Z][A-Z0-9_]*)")
# The same, keeping the offset and the instruction's text (up to the ';').
_ADDRESSED_RE = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+((?:@!?\w+\s+)?([A-Z][A-Z0-9_]*)[^;]*)")
_INSTRUCTION_BYTES = 16
# The build's SASS listing, kept beside its library in the build cache (which candidates cannot
# write: ptxgym.sandbox.landlock).
LISTING_FILE = "sass.txt"
# Hopper's warpgroup matrix instruction and its shape, after any predicate guard.
_MMA_SHAPE_RE = re.compile(r"^(?:@!?\w+\s+)?HGMMA\.(\d+)x(\d+)x(\d+)\b")
_WARPS_PER_WARPGROUP = 4


@dataclass(frozen=True)
class KernelSass:
    """The static instruction count of each SASS opcode mnemonic in one kernel."""

    name: str
    opcodes: dict[str, int]


@dataclass(frozen=True)
class SassInventory:
    """What the library's SASS for the task's architecture holds; ``error`` when not inspected."""

    tool: str
    kernels: tuple[KernelSass, ...]
    families_present: dict[str, bool]
    error: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SassInventory:
        """Rebuild an inventory from its ``dataclasses.asdict`` form (a cached build's JSON)."""
        kernels = tuple(KernelSass(**kernel) for kernel in data["kernels"])
        return cls(**{**data, "kernels": kernels})


def inventory(library: Path, task: Task) -> SassInventory:
    """The SASS inventory of ``library`` for ``task``'s target; never raises. The listing is
    kept beside the library (``LISTING_FILE``): every count or profile of the build joins its
    executed counts with it (``target_addresses``), and disassembling anew took ~1 CPU second
    per evaluation on the H200 host (issue 25)."""
    described, listing, error = _dump(library)
    if listing is None:
        return SassInventory(described, (), {}, error)
    library.with_name(LISTING_FILE).write_text(listing, encoding="utf-8")
    kernels = parse_sass(listing, task.target.arch)
    totals: Counter[str] = Counter()
    for kernel in kernels:
        totals.update(kernel.opcodes)
    present: dict[str, bool] = {
        key: family_present(totals, family)
        for key, family in task.target.instruction_families.items()
    }
    return SassInventory(described, kernels, present)


@dataclass(frozen=True)
class FunctionListing:
    """Where a function's target instructions are: its size in bytes (every instruction is 16
    bytes at an offset that is a multiple of 16 below it), and the offset and text of each
    instruction whose opcode belongs to one of the task's target families."""

    size: int
    targets: dict[int, str]


def target_addresses(library: Path, task: Task) -> dict[str, FunctionListing]:
    """Per function of ``library`` (by its symbol, as CUDA names it), the listing executed
    counts per instruction address are joined with: from the listing its build kept, else made
    now. Raises ``RuntimeError`` when the library cannot be disassembled."""
    kept = library.with_name(LISTING_FILE)
    if kept.is_file():
        listing = kept.read_text(encoding="utf-8", errors="replace")
    else:
        described, dumped, error = _dump(library)
        if dumped is None:
            raise RuntimeError(f"{described}: {error}")
        listing = dumped
    patterns = tuple(
        pattern
        for family in task.target.instruction_families.values()
        for group in family.all_of
        for pattern in group
    )
    sizes: dict[str, int] = {}
    targets: dict[str, dict[int, str]] = {}
    current: str | None = None
    in_arch = False
    for line in listing.splitlines():
        if match := _ARCH_RE.match(line):
            in_arch = match.group(1) == task.target.arch
            current = None
        elif match := _FUNCTION_RE.match(line):
            current = match.group(1) if in_arch else None
            if current is not None:
                sizes[current], targets[current] = 0, {}
        elif current is not None and (match := _ADDRESSED_RE.match(line)):
            offset, text, opcode = int(match.group(1), 16), match.group(2), match.group(3)
            sizes[current] = offset + _INSTRUCTION_BYTES
            if any(fnmatchcase(opcode, pattern) for pattern in patterns):
                targets[current][offset] = " ".join(text.split())
    return {name: FunctionListing(sizes[name], targets[name]) for name in sizes}


def mnemonic(instruction: str) -> str:
    """An instruction's opcode without its modifiers, after any predicate guard (@P0, @!UP1)."""
    words = instruction.split()
    return words[1 if words[0].startswith("@") else 0].split(".")[0]


def flops_per_warp(instruction: str) -> int | None:
    """The floating-point work one warp-level execution of a matrix instruction does, from its
    text (``HGMMA.64x256x16.F32.BF16 ...``: a warpgroup's m x n x k multiply-adds, a quarter per
    warp, 2 FLOPs each); None for an instruction whose shape the text does not give."""
    found = _MMA_SHAPE_RE.match(instruction)
    if found is None:
        return None
    m, n, k = (int(found.group(i)) for i in (1, 2, 3))
    return 2 * m * n * k // _WARPS_PER_WARPGROUP


def _dump(library: Path) -> tuple[str, str | None, str]:
    """cuobjdump's name and version, and its SASS listing of ``library`` (None, with why, when
    there is none)."""
    tool = find_cuobjdump()
    if tool is None:
        return (
            "cuobjdump",
            None,
            "cuobjdump was not found (install the CUDA toolkit or nvidia-cuda-cuobjdump)",
        )
    described = f"{tool} ({_version(tool)})"
    # cuobjdump delegates disassembly to nvdisasm, which it looks for beside itself and on PATH.
    search = [os.environ.get("PATH", "/usr/bin:/bin")]
    if nvdisasm := _wheel_binary("nvidia-cuda-nvdisasm", "nvdisasm"):
        search.append(str(nvdisasm.parent))
    try:
        out = subprocess.run(
            [str(tool), "--dump-sass", str(library)],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=TIMEOUT_S,
            check=False,
            env={"PATH": os.pathsep.join(search), "LANG": "C", "LC_ALL": "C"},
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return described, None, f"cuobjdump timed out after {TIMEOUT_S:.0f} s"
    except OSError as exc:
        return described, None, f"cuobjdump could not run: {exc.strerror}"
    if out.returncode != 0:
        lines = [line for line in (out.stderr or out.stdout).splitlines() if line.strip()]
        detail = lines[-1].replace(str(library), library.name) if lines else "no output"
        message = f"cuobjdump failed with exit code {out.returncode}: {detail}"
        return described, None, message[:_MAX_ERROR_CHARS]
    return described, out.stdout, ""


def parse_sass(listing: str, arch: str) -> tuple[KernelSass, ...]:
    """Opcode counts per function of a ``cuobjdump --dump-sass`` listing, for ``arch`` only."""
    functions: list[tuple[str, Counter[str]]] = []
    current: Counter[str] | None = None
    in_arch = False
    for line in listing.splitlines():
        if match := _ARCH_RE.match(line):
            in_arch = match.group(1) == arch
            current = None
        elif match := _FUNCTION_RE.match(line):
            current = Counter()
            if in_arch:
                functions.append((match.group(1), current))
        elif current is not None and (match := _INSTRUCTION_RE.match(line)):
            current[match.group(1)] += 1
    names = demangle([name for name, _ in functions])
    return tuple(
        KernelSass(names[name], dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))))
        for name, counts in functions
    )


def matching_count(opcodes: Mapping[str, int], patterns: Iterable[str]) -> int:
    """How many instructions have an opcode that matches one of the ``fnmatch`` patterns."""
    patterns = tuple(patterns)
    return sum(
        count
        for opcode, count in opcodes.items()
        if any(fnmatchcase(opcode, pattern) for pattern in patterns)
    )


def family_present(opcodes: Mapping[str, int], family: InstructionFamily) -> bool:
    """Every group of the family has an opcode present."""
    return all(matching_count(opcodes, group) > 0 for group in family.all_of)


def find_cuobjdump() -> Path | None:
    """cuobjdump on PATH, in ``$CUDA_HOME/bin``, or from the nvidia-cuda-cuobjdump wheel."""
    found = paths.cuda_tool("cuobjdump")
    return Path(found) if found else _wheel_binary("nvidia-cuda-cuobjdump", "cuobjdump")


def _wheel_binary(distribution: str, name: str) -> Path | None:
    """An executable that an installed NVIDIA wheel ships under some ``bin/`` folder.

    The folder differs between releases (``nvidia/cuda_cuobjdump/bin``, ``nvidia/cu13/bin``), so
    it is read from the wheel's file list rather than assumed.
    """
    try:
        files = importlib.metadata.files(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name == name and file.parent.name == "bin":
            path = Path(str(file.locate()))
            if os.access(path, os.X_OK):
                return path
    return None


@cache
def _version(tool: Path) -> str:
    """cuobjdump's version, e.g. ``V13.5.37``, recorded with each inventory."""
    try:
        out = subprocess.run(
            [str(tool), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return "version unknown"
    found = re.search(r"\bV\d+(?:\.\d+)+", out.stdout)
    return found.group() if found else "version unknown"


def demangle(names: list[str]) -> dict[str, str]:
    """C++ symbol names as written in source (with c++filt), or unchanged where that fails."""
    if not names or not shutil.which("c++filt"):
        return {n: n for n in names}
    out = subprocess.run(
        ["c++filt"], input="\n".join(names), capture_output=True, text=True, check=False
    )
    demangled = out.stdout.splitlines()
    if out.returncode != 0 or len(demangled) != len(names):
        return {n: n for n in names}
    return dict(zip(names, demangled, strict=True))
