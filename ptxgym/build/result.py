"""The record of one build, whatever language it was built from: success, the log shown to the
model, the kernels' resources, the library to load and the static inventory of its SASS."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ptxgym.build.sass import SassInventory

DEFAULT_COMPILE_TIMEOUT_S = 180.0
"""A build's deadline unless the evaluator is given another."""


class CompilerUnavailable(RuntimeError):
    """nvcc (or the binutils it needs) is not installed: no candidate can be built here."""


@dataclass(frozen=True)
class KernelResources:
    """What ptxas reports for one ``__global__`` function."""

    name: str
    registers: int
    shared_bytes: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    barriers: int


@dataclass(frozen=True)
class CompileResult:
    """The outcome of building one candidate for one task's target."""

    ok: bool
    log: str
    source_hash: str
    arch: str
    seconds: float
    cached: bool = False
    timed_out: bool = False
    # The failure came from the machine, not the source (the deadline passed, a compiler was
    # killed or crashed, a tool is missing): it is not cached, and a retry may build.
    transient: bool = False
    warnings: tuple[str, ...] = ()
    kernels: tuple[KernelResources, ...] = ()
    library: str | None = None
    command: tuple[str, ...] = field(default=(), repr=False)
    sass: SassInventory | None = field(default=None, repr=False)
    # Set when the build itself found something the policy forbids (what the source scan cannot
    # see: directives assembled by macros, calls to functions host code may not use).
    policy_violation: str | None = None
    # The action language it was built from (``ptxgym.languages.LANGUAGES``): the judge loads
    # and calls its library as that language's entry kind.
    language: str = "cuda"

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> CompileResult:
        """A result from its ``dataclasses.asdict`` form (a cached build's record)."""
        sass = data["sass"]
        return cls(
            **{
                **data,
                "kernels": tuple(KernelResources(**kernel) for kernel in data["kernels"]),
                "warnings": tuple(data["warnings"]),
                "command": tuple(data["command"]),
                "sass": SassInventory.from_dict(sass) if sass is not None else None,
            }
        )
