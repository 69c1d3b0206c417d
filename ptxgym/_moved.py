"""The module names ptxgym had before its stages became subpackages, or before a module moved to
another stage, kept importable.

``import ptxgym.gpu_evaluator`` (or ``from ptxgym.judge import JudgeSettings``) still works: the old
name is a module that forwards every attribute to the new one and warns once, with a
``DeprecationWarning`` naming the new home. Where a module was later split by job, a name the new
module no longer holds is looked up in the modules it went to (``SPLIT``). The old names go in
ptxgym 0.3.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any

MOVED: dict[str, str] = {
    "ptxgym.evaluator": "ptxgym.evaluate",
    "ptxgym.baselines": "ptxgym.evaluate.baselines",
    "ptxgym.build_budget": "ptxgym.build.budget",
    "ptxgym.build_sandbox": "ptxgym.build.sandbox",
    "ptxgym.channel": "ptxgym.sandbox.channel",
    "ptxgym.compiler": "ptxgym.languages.cuda.compiler",
    "ptxgym.correctness": "ptxgym.evaluate.correctness",
    "ptxgym.cpp_tokens": "ptxgym.languages.cuda.cpp_tokens",
    "ptxgym.expressions": "ptxgym.tasks.expressions",
    "ptxgym.extract": "ptxgym.languages.cuda.extract",
    "ptxgym.gpu_evaluator": "ptxgym.evaluate.local_gpu",
    "ptxgym.gpu_lock": "ptxgym.device.lock",
    "ptxgym.gpus": "ptxgym.device.gpus",
    "ptxgym.isolation": "ptxgym.sandbox.isolation",
    "ptxgym.judge": "ptxgym.evaluate.judge",
    "ptxgym.judge_server": "ptxgym.evaluate.judge_server",
    "ptxgym.landlock": "ptxgym.sandbox.landlock",
    "ptxgym.metrics": "ptxgym.records.metrics",
    "ptxgym.packs": "ptxgym.tasks.packs",
    "ptxgym.policy": "ptxgym.languages.cuda.policy",
    "ptxgym.processes": "ptxgym.sandbox.processes",
    "ptxgym.profile": "ptxgym.evaluate.profile",
    "ptxgym.protocol": "ptxgym.evaluate.worker_protocol",
    "ptxgym.report": "ptxgym.bench.report",
    "ptxgym.runner": "ptxgym.bench.runner",
    "ptxgym.sanitizer": "ptxgym.evaluate.sanitizer",
    "ptxgym.sass": "ptxgym.build.sass",
    "ptxgym.seccomp": "ptxgym.sandbox.seccomp",
    "ptxgym.single_call": "ptxgym.evaluate.single_call",
    "ptxgym.timing": "ptxgym.evaluate.timing",
    "ptxgym.tool_runs": "ptxgym.evaluate.tool_runs",
    "ptxgym.trace": "ptxgym.interop.flashinfer_trace",
    "ptxgym.verdict_json": "ptxgym.evaluate.verdict_json",
    "ptxgym.worker": "ptxgym.evaluate.worker",
    # The records of turns and what is computed from them left bench for a stage of their own,
    # below the wrappers that write them (ptxgym.records).
    "ptxgym.bench.records": "ptxgym.records.turns",
    "ptxgym.bench.metrics": "ptxgym.records.metrics",
    "ptxgym.bench.quality": "ptxgym.records.quality",
    "ptxgym.bench.transitions": "ptxgym.records.transitions",
}

# Modules split by job after they moved: where the names that left them went.
SPLIT: dict[str, tuple[str, ...]] = {
    "ptxgym.evaluate.judge": (
        "ptxgym.evaluate.judge_settings",
        "ptxgym.evaluate.workload_state",
        "ptxgym.evaluate.conversation",
        "ptxgym.evaluate.verdict",
        "ptxgym.evaluate.worker_process",
        "ptxgym.evaluate.reference_checks",
    ),
    "ptxgym.bench.report": (
        "ptxgym.bench.runs",
        "ptxgym.bench.plots",
        "ptxgym.bench.categories",
        "ptxgym.bench.tables",
    ),
    "ptxgym.interop.flashinfer_trace": (
        "ptxgym.interop.flashinfer_schema",
        "ptxgym.interop.reference_source",
    ),
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old names only; every other import goes to the next finder."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def exec_module(self, module: ModuleType) -> None:
        new_name = MOVED[module.__name__]
        warnings.warn(
            f"{module.__name__} moved to {new_name}; import it from there "
            "(the old name goes in ptxgym 0.3)",
            DeprecationWarning,
            stacklevel=2,
        )
        new = importlib.import_module(new_name)

        def forward(name: str) -> Any:
            for home in (new_name, *SPLIT.get(new_name, ())):
                owner = importlib.import_module(home)
                if hasattr(owner, name):
                    return getattr(owner, name)
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")

        module.__dict__["__getattr__"] = forward
        module.__doc__ = new.__doc__


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once), before any finder that could still see
    an old file of the same name (an editable install of an older checkout)."""
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedModules())
