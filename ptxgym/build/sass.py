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

A Triton candidate has no library: its kernels are cubins in a Triton cache, made by its compile
run, one kernel each, and several may share a name (autotuning's variants, other
specialisations). Their listing (``module_listing``) is one section per cubin, each opened by a
``MODULE_MARK`` line naming it, and the count joins its executed counts only with the sections of
the cubins the counted call loaded (``target_addresses(..., modules=...)``). A bare cubin's
listing names its architecture as ``code for sm_90a`` rather than ``arch = sm_90a``. The cubins
were written by a process that ran candidate code, so cuobjdump reads them confined (Landlock:
the tool's own folders, the system's and the cubins', nothing else).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import cache
from pathlib import Path
from typing import Any

from ptxgym import paths
from ptxgym.sandbox import landlock
from ptxgym.tasks import InstructionFamily, Task

TIMEOUT_S = 60.0
_MAX_ERROR_CHARS = 300

# "arch = sm_90a" in a library's fatbinary; "code for sm_90a" in a bare cubin's listing (and,
# again, in a library's, for the same architecture).
_ARCH_RE = re.compile(r"^(?:arch = |\s*code for )(\S+)")
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
# Opens each cubin's section of a listing of several (``module_listing``), with its name.
MODULE_MARK = "ptxgym-module "
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


def kept_listing(library: Path) -> str | None:
    """The SASS listing kept beside ``library`` (``LISTING_FILE``, written by ``inventory``);
    None when its build kept none."""
    kept = library.with_name(LISTING_FILE)
    return kept.read_text(encoding="utf-8", errors="replace") if kept.is_file() else None


def target_addresses(
    library: Path, task: Task, modules: Collection[str] | None = None
) -> dict[str, FunctionListing]:
    """Per function of ``library`` (by its symbol, as CUDA names it), the listing executed
    counts per instruction address are joined with: from the listing its build kept, else made
    now. With ``modules``, only the sections of those cubins (a Triton candidate's listing,
    ``module_listing``), which must not give one name to two different functions; without,
    functions of one name are merged. Raises ``RuntimeError`` when the library cannot be
    disassembled, or a name is ambiguous."""
    listing = kept_listing(library)
    if listing is None:
        described, dumped, error = _dump(library)
        if dumped is None:
            raise RuntimeError(f"{described}: {error}")
        listing = dumped
    patterns = target_patterns(task)
    found: dict[str, FunctionListing] = {}
    sizes: dict[str, int] = {}
    targets: dict[str, dict[int, str]] = {}
    current: str | None = None
    in_arch = False
    included = modules is None
    for line in listing.splitlines():
        if line.startswith(MODULE_MARK):
            _keep_functions(found, sizes, targets, modules is not None)
            included = modules is None or line[len(MODULE_MARK) :].strip() in modules
            in_arch, current = False, None
        elif match := _ARCH_RE.match(line):
            in_arch = included and match.group(1) == task.target.arch
            current = None
        elif match := _FUNCTION_RE.match(line):
            current = match.group(1) if in_arch else None
            if current is not None:
                if current in sizes:  # the same name twice in one section: keep the one
                    _keep_functions(found, sizes, targets, modules is not None)
                sizes[current], targets[current] = 0, {}
        elif current is not None and (match := _ADDRESSED_RE.match(line)):
            offset, text, opcode = int(match.group(1), 16), match.group(2), match.group(3)
            sizes[current] = offset + _INSTRUCTION_BYTES
            if matches_any(opcode, patterns):
                targets[current][offset] = " ".join(text.split())
    _keep_functions(found, sizes, targets, modules is not None)
    return found


def _keep_functions(
    found: dict[str, FunctionListing],
    sizes: dict[str, int],
    targets: dict[str, dict[int, str]],
    strict: bool,
) -> None:
    """Move the functions of one section into ``found`` (and empty ``sizes`` and ``targets``).
    A name already there for another function (another size or other target instructions):
    with ``strict`` (counts are to be joined), ambiguous, since counts named by it could not be
    told apart; otherwise the two are merged (every target instruction of either), which is
    what a static look at every variant needs."""
    for name, size in sizes.items():
        listing = FunctionListing(size, targets[name])
        kept = found.setdefault(name, listing)
        if kept == listing:
            continue
        if strict:
            raise RuntimeError(
                f"two loaded kernels are both named {name}: their counts cannot be told apart"
            )
        found[name] = FunctionListing(max(kept.size, size), {**kept.targets, **listing.targets})
    sizes.clear()
    targets.clear()


def module_listing(cubins: Mapping[str, Path]) -> str:
    """The SASS listing of every cubin of ``cubins`` (name: path), one section each opened by
    ``MODULE_MARK`` and its name, disassembled confined to the cubin's folder where the kernel
    has Landlock. Raises ``RuntimeError`` when one cannot be disassembled."""
    sections = []
    for name, cubin in sorted(cubins.items()):
        described, dumped, error = _dump(cubin, confined=True)
        if dumped is None:
            raise RuntimeError(f"{described}: {error}")
        sections.append(f"{MODULE_MARK}{name}\n{dumped}")
    return "".join(sections)


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


def _dump(library: Path, confined: bool = False) -> tuple[str, str | None, str]:
    """cuobjdump's name and version, and its SASS listing of ``library`` (None, with why, when
    there is none). ``confined``: cuobjdump may read only its own and nvdisasm's folders, the
    system's and the library's folder, and write nothing, where the kernel has Landlock (for a
    file a candidate's process wrote)."""
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
    command = [str(tool), "--dump-sass", str(library)]
    # cuobjdump writes its intermediate files to TMPDIR: a folder of this call's own.
    with tempfile.TemporaryDirectory(prefix="ptxgym-cuobjdump-") as scratch:
        if confined and landlock.abi_version() >= 1:
            helpers = [tool, *([nvdisasm] if nvdisasm else [])]
            if located := shutil.which("nvdisasm", path=os.pathsep.join(search)):
                helpers.append(Path(located))
            command = _confined(command, [library.parent, *helpers], Path(scratch))
        try:
            out = subprocess.run(
                command,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=TIMEOUT_S,
                check=False,
                env={
                    "PATH": os.pathsep.join(search),
                    "LANG": "C",
                    "LC_ALL": "C",
                    "TMPDIR": scratch,
                },
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


def _confined(command: list[str], places: list[Path], scratch: Path) -> list[str]:
    """``command`` run through the Landlock launcher: reading only the system's programs and
    libraries and the folders of ``places`` (files: the tools; folders: their contents), as
    given and resolved, and writing only in ``scratch``."""
    reads: list[str | Path] = [*landlock.SYSTEM_PROGRAMS, *landlock.LOADER_FILES, "/dev/null"]
    for place in places:
        folder = place if place.is_dir() else place.parent
        reads += [folder, folder.resolve(), place.resolve().parent]
    launcher = [sys.executable, "-I", "-S", str(Path(landlock.__file__).resolve())]
    arguments = [*(f"--read={path}" for path in dict.fromkeys(reads)), f"--write={scratch}"]
    return [*launcher, *arguments, "--", *command]


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


def target_patterns(task: Task) -> tuple[str, ...]:
    """The ``fnmatch`` patterns of every opcode of the task's target families."""
    return tuple(
        pattern
        for family in task.target.instruction_families.values()
        for group in family.all_of
        for pattern in group
    )


def matches_any(opcode: str, patterns: Iterable[str]) -> bool:
    """Whether ``opcode`` matches one of the ``fnmatch`` patterns (case-sensitive, as SASS
    opcodes are upper case)."""
    return any(fnmatchcase(opcode, pattern) for pattern in patterns)


def matching_count(opcodes: Mapping[str, int], patterns: Iterable[str]) -> int:
    """How many instructions have an opcode that matches one of the ``fnmatch`` patterns."""
    patterns = tuple(patterns)
    return sum(count for opcode, count in opcodes.items() if matches_any(opcode, patterns))


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
