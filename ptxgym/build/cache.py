"""The on-disk cache of builds, shared by every language's build: one folder per build key
holding the build's record (``RESULT_FILE``) and, for a success, its artifact (a library, a
module). A build is made in a temporary folder and published by renaming it into place, so a
reader never sees half of one and two processes making the same build keep the first."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import asdict, replace
from pathlib import Path

from ptxgym.build.result import CompileResult

RESULT_FILE = "result.json"


def load(folder: Path, artifact: str) -> CompileResult | None:
    """The cached build in ``folder`` (its ``library`` the ``artifact`` file there), or None when
    there is none; marks it recently used, so ``prune`` keeps it longest."""
    try:
        data = json.loads((folder / RESULT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    os.utime(folder)
    return _located(replace(CompileResult.from_record(data), cached=True), folder, artifact)


def publish(work: Path, final: Path, result: CompileResult, artifact: str) -> CompileResult:
    """Write ``result``'s record into the build folder ``work`` and rename it to ``final``; when
    another process published the same build first, its result."""
    (work / RESULT_FILE).write_text(json.dumps(asdict(result)), encoding="utf-8")
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(work, final)
    except OSError:
        if cached := load(final, artifact):
            return cached
        raise
    return _located(result, final, artifact)


def prune(builds: Path, *, max_builds: int, max_bytes: int | None = None) -> None:
    """Keep the cache under ``builds`` bounded: drop the least recently used builds beyond
    ``max_builds`` entries or (when given) ``max_bytes`` bytes."""
    entries = []
    for entry in (entry for prefix in builds.iterdir() for entry in prefix.iterdir()):
        with contextlib.suppress(OSError):  # another process pruned it meanwhile
            size = sum(path.stat().st_size for path in entry.iterdir())
            entries.append((entry.stat().st_mtime, size, entry))
    entries.sort(key=lambda item: item[0])
    count, total = len(entries), sum(size for _, size, _ in entries)
    for _, size, entry in entries:
        if count <= max_builds and (max_bytes is None or total <= max_bytes):
            break
        shutil.rmtree(entry, ignore_errors=True)
        count, total = count - 1, total - size


def _located(result: CompileResult, folder: Path, artifact: str) -> CompileResult:
    return replace(result, library=str(folder / artifact)) if result.ok else result
