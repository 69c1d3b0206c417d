"""What a compiler process may read: the toolkit, the system's programs, libraries and headers, and
its own build folder; nothing of the user's.

A candidate source steers the compiler's preprocessor, and through it what files the compiler opens
and quotes in its diagnostics (an include, a ``#line`` directive naming another file, an assembler
``.incbin``). The static policy refuses every such construct it recognises, and the compile log
shows only the submission's own lines; this is the layer that holds when both are fooled: nvcc and
everything it starts (cicc, ptxas, gcc, as, ld) run under a Landlock ruleset
(``ptxgym.sandbox.landlock``) that lets them read and run files only beneath the folders below and
write only in the build folder. The user's home, the project, ptxgym's cache (other candidates'
sources and libraries, baselines, the judge's key), /tmp and other processes' /proc entries are out
of reach.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

from ptxgym.sandbox import landlock

# The system's programs, libraries and headers (gcc, binutils, libc, the C++ standard library),
# and the few files of /etc and /dev that the dynamic loader and the compilers open.
_SYSTEM_READABLE = (
    *landlock.SYSTEM_PROGRAMS,
    *landlock.LOADER_FILES,
    "/dev/null",
    "/dev/zero",
    "/dev/urandom",
)
# The host tools nvcc runs, found on PATH: their installation prefixes are readable too, for a
# compiler installed outside /usr (a module system's gcc, a conda environment's).
_HOST_TOOLS = ("gcc", "g++", "cc", "c++", "as", "ld", "nm")
_TOOLKIT_TOP_RE = re.compile(r"^#\$ TOP=(.+)$", re.MULTILINE)


def available() -> bool:
    """Whether this kernel can confine compiler processes (Landlock, Linux 5.13+)."""
    return landlock.abi_version() >= 1


def confined_command(command: list[str], nvcc: str, build_folder: Path) -> list[str]:
    """``command`` (an nvcc invocation run in ``build_folder``) wrapped so that it and its
    children read only the toolkit of ``nvcc``, the system and ``build_folder``, and write only
    in ``build_folder``. Call only where :func:`available`; the wrapper refuses to run the
    command unconfined."""
    reads = [f"--read={path}" for path in readable_paths(nvcc)]
    launcher = [sys.executable, "-I", "-S", str(Path(landlock.__file__).resolve())]
    return [*launcher, *reads, f"--write={build_folder}", "--", *command]


@cache
def readable_paths(nvcc: str) -> tuple[Path, ...]:
    """Everything a compiler process of ``nvcc`` may read, besides its build folder."""
    paths = [Path(p) for p in _SYSTEM_READABLE]
    paths += _installation(Path(nvcc))
    if toolkit := toolkit_root(nvcc):
        paths.append(toolkit)
    for tool in _HOST_TOOLS:
        if found := shutil.which(tool):
            paths += _installation(Path(found))
    return tuple(dict.fromkeys(path for path in paths if path != Path("/")))


# What of a program's installation prefix (``<prefix>/bin/<program>``) its compiler reads: not the
# whole prefix, which for a program in ~/bin would be the user's home.
_PREFIX_PARTS = ("bin", "lib", "lib64", "libexec", "include", "share")


def _installation(program: Path) -> list[Path]:
    """A program's folder and its prefix's library and header folders, as found and as resolved."""
    folders = []
    for candidate in (program, program.resolve()):
        prefix = candidate.parent.parent
        folders += [candidate.parent, *(prefix / part for part in _PREFIX_PARTS)]
    return folders


@cache
def toolkit_root(nvcc: str) -> Path | None:
    """The toolkit's top folder, as nvcc itself reports it (``nvcc`` may be a wrapper script
    elsewhere, e.g. /usr/local/bin/nvcc running /usr/local/cuda-13.0/bin/nvcc)."""
    try:
        out = subprocess.run(
            [nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    found = _TOOLKIT_TOP_RE.search(out.stdout + out.stderr)
    return Path(found.group(1).strip()).resolve() if found else None
