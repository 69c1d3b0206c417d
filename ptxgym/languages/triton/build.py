"""Build a Triton candidate on the CPU: byte-compile it (never run it) and keep it in the cache.

A Triton module has nothing to compile ahead of time that does not depend on running it: its
kernels are specialised on the arguments the entry passes, and autotuning times them. So this
step only proves that Python can compile the module (a syntax error is a ``COMPILE_ERROR`` with
its line quoted from our own copy), and stores the module where the judge finds it: the build's
"library" is ``candidate.py`` in a folder of the build cache named by the content hash. The
kernels are compiled on the GPU host by the compile run (``ptxgym.evaluate.compile_run``), before
the evaluation and outside its timing.

``compile()`` parses and byte-compiles in this process without executing anything of the module;
the static policy (``ptxgym.languages.triton.policy``) has passed it already. Folders are made
under ``<cache>/tmp`` and renamed into place, so concurrent builds of one module are safe; the
cache keeps at most ``MAX_CACHED_BUILDS`` modules, least recently used dropped first.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from ptxgym import paths
from ptxgym.build import cache
from ptxgym.build.result import CompileResult
from ptxgym.languages.triton.policy import entry_parameters
from ptxgym.tasks import Task

MODULE_FILE = "candidate.py"
MAX_CACHED_BUILDS = 4000
# Bump when the build or its record changes, to invalidate cached results.
_RECIPE_VERSION = "1"
_CACHE_FOLDER = "builds-triton"
_MAX_QUOTE_CHARS = 200


def build_module(source: str, task: Task, *, cache_root: Path | None = None) -> CompileResult:
    """Byte-compile ``source`` (a module that passed the policy) and keep it, or return the
    cached result of an identical build."""
    started = time.perf_counter()
    root = (cache_root or paths.cache_dir()) / _CACHE_FOLDER
    key = _key(source, task)
    final = root / key[:2] / key
    if cached := cache.load(final, MODULE_FILE):
        return cached
    result = CompileResult(
        ok=True,
        log="",
        source_hash=key,
        arch=task.target.arch,
        seconds=0.0,
        language="triton",
    )
    try:
        compile(source, MODULE_FILE, "exec", dont_inherit=True)
    except SyntaxError as exc:
        result = replace(result, ok=False, log=_syntax_log(exc, source))
    except (ValueError, RecursionError, MemoryError) as exc:
        result = replace(result, ok=False, log=f"{MODULE_FILE}: error: cannot be compiled ({exc})")
    result = replace(result, seconds=round(time.perf_counter() - started, 3))
    (root.parent / "tmp").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-triton-", dir=root.parent / "tmp"))
    try:
        if result.ok:
            (work / MODULE_FILE).write_text(source, encoding="utf-8")
        published = cache.publish(work, final, result, MODULE_FILE)
        # Modules are a few kB each: the count bounds the cache.
        cache.prune(root, max_builds=MAX_CACHED_BUILDS)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return published


def _key(source: str, task: Task) -> str:
    """Content hash of what decides the build: the module and the entry it must define."""
    digest = hashlib.sha256()
    for part in (_RECIPE_VERSION, source, task.entry_point.symbol, *entry_parameters(task)):
        digest.update(part.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    return digest.hexdigest()


def _syntax_log(error: SyntaxError, source: str) -> str:
    """The syntax error as the model reads it: where, what, and the line from our own copy of
    the source with a caret (never Python's echo of it)."""
    line = error.lineno or 0
    block = f"{MODULE_FILE}({line}): error: {error.msg}"
    lines = source.split("\n")
    text = lines[line - 1].rstrip() if 0 < line <= len(lines) else ""
    if text.strip():
        block += f"\n  {text[:_MAX_QUOTE_CHARS]}"
        if error.offset is not None and 0 < error.offset <= min(len(text), _MAX_QUOTE_CHARS) + 1:
            block += "\n  " + " " * (error.offset - 1) + "^"
    return block
