"""The compile run: a Triton candidate's kernels compiled and autotuned before its evaluation.

A Triton kernel is compiled when it is first launched, by Triton running ptxas and the C compiler,
and autotuning times its variants then too. Neither may happen in the worker: it may start no
program (``ptxgym.sandbox.seccomp``), and JIT and autotuning in its timed calls would be timed.
So before the worker gets the candidate, the judge runs it here once (``prepare``): a process of
its own imports the module and calls the entry once on each of the task's workloads, with inputs
from the task's trusted generator and a fresh seed, holding the GPU shared. Triton compiles every
kernel the calls launch, autotunes, and keeps it all in a Triton cache in the run's folder.

The run executes candidate code, with more freedom than the worker (it must start ptxas and the
compiler), and as little more as that needs: a scrubbed environment and its own folder (as the
worker); writes only in that folder and reads only what the worker may read (Landlock, from
before CUDA starts); no program but Triton's ptxas, the C compiler's own and their loader
(Landlock's execute right, ``ptxgym.languages.triton.runtime.compiler_programs``); the worker's
seccomp filter without its ban on new processes (no sockets but AF_UNIX, no signals to others,
no tracing); its own network namespace where allowed; the stage deadline on its whole process
group.

The judge then takes a snapshot of the run's cache (regular files only, bounded) into a folder
of its own, with the module and the SASS listing of every cubin (``ptxgym.build.sass``): that
folder is the prepared candidate (``Prepared``) that the worker and every tool run get a copy of
(``ptxgym.evaluate.single_call.hand_candidate``), each finding all its kernels compiled
(``ptxgym.languages.triton.runtime``).
A kernel that fails to compile is a ``COMPILE_ERROR`` with Triton's message; an exception of the
entry's, a ``RUNTIME_ERROR``; a run past the deadline, a ``TIMEOUT``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ptxgym.build.sass import LISTING_FILE, module_listing
from ptxgym.device.gpus import initialize_driver, make_context, physical_device
from ptxgym.device.lock import gpu_lock_for, holding, startup_hold, startup_lock_for
from ptxgym.languages import get_language
from ptxgym.languages.base import ENTRY_C_ABI
from ptxgym.languages.triton.build import MODULE_FILE
from ptxgym.languages.triton.runtime import (
    CACHE_FOLDER,
    TritonEntry,
    compiler_programs,
    environment,
    host_facts,
)
from ptxgym.outcome import Status
from ptxgym.sandbox.isolation import confine, hand_library, python_environment, seal
from ptxgym.sandbox.processes import ProcessGroup
from ptxgym.tasks import Task

EXIT_COMPILE_ERROR = 3  # a kernel did not compile
EXIT_RUNTIME_ERROR = 4  # the entry raised
RESULT_FILE = "compile-run.json"
# What a snapshot of the run's cache may hold: the three examples' caches are under 2 MB, an
# autotuned kernel of many variants a few tens.
MAX_CACHE_BYTES = 512 << 20
MAX_CACHE_FILES = 20_000
# What of a failure's message is shown: Triton's CompilationError quotes the kernel's source
# around the error, which is the candidate's own text.
_MAX_MESSAGE_CHARS = 3000
_TAIL_CHARS = 1500
# Triton's errors for a kernel that does not compile (matched by name: they are raised in the
# candidate's process and reported here as text).
_COMPILE_ERRORS = frozenset(
    {
        "CompilationError",
        "CompileTimeAssertionFailure",
        "UnsupportedLanguageConstruct",
        "PTXASError",
        "OutOfResources",
    }
)


@dataclass(frozen=True)
class Prepared:
    """A candidate ready for the judge's processes: what they load (``library``), how
    (``entry``, the language's entry kind) and what a Triton entry is told (``facts``); or the
    verdict's status and message when it could not be prepared (``failure``)."""

    library: str
    entry: str
    facts: dict[str, str] = field(default_factory=dict)
    failure: tuple[Status, str] | None = None
    seconds: float = 0.0
    folder: Path | None = None
    """The prepared folder, the caller's to remove (``close``)."""

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def prepare(
    task: Task,
    library: str,
    language: str,
    *,
    device: int,
    folder: Path,
    timeout_s: float,
    lock_startup: bool = True,
) -> Prepared:
    """``library`` (a build of ``language``) prepared for the worker and the tool runs: as it is
    for a C entry; for Triton, compiled and autotuned by a compile run on GPU ``device`` within
    ``timeout_s``, in a new folder under ``folder``. Raises ``TritonUnavailable`` when Triton
    cannot run on this host (not the candidate's fault)."""
    entry = get_language(language).entry
    if entry == ENTRY_C_ABI:
        return Prepared(library, entry)
    started = time.perf_counter()
    facts = host_facts(task.target.arch)
    run = folder / f"compile-{secrets.token_hex(4)}"
    prepared = folder / f"prepared-{secrets.token_hex(4)}"
    run.mkdir(parents=True)
    try:
        hand_library(library, run, MODULE_FILE)
        spec = {
            "task": task.model_dump(mode="json"),
            "workloads": [workload.payload() for workload in task.workloads],
            "seed": secrets.randbits(60),
            "facts": facts,
            "gpu_lock": gpu_lock_for(device),
            "startup_lock": startup_lock_for(device, lock_startup),
        }
        (run / "spec.json").write_text(json.dumps(spec))
        group = ProcessGroup(
            [sys.executable, "-m", "ptxgym.evaluate.compile_run", str(run / "spec.json")],
            env={
                **python_environment(run),
                "CUDA_VISIBLE_DEVICES": physical_device(device),
            },
            cwd=run,
        )
        code, output = group.wait(timeout_s)
        seconds = time.perf_counter() - started
        if code != 0:
            return Prepared(library, entry, facts, _failure(code, output, run, timeout_s), seconds)
        prepared.mkdir()
        problem = _snapshot(run / CACHE_FOLDER, prepared / CACHE_FOLDER)
        if problem is not None:
            shutil.rmtree(prepared, ignore_errors=True)
            return Prepared(library, entry, facts, (Status.RUNTIME_ERROR, problem), seconds)
        # The build's module, not the run's copy, which the candidate's code could rewrite.
        shutil.copyfile(library, prepared / MODULE_FILE)
        cubins = {
            path.relative_to(prepared / CACHE_FOLDER).as_posix(): path
            for path in sorted((prepared / CACHE_FOLDER).rglob("*.cubin"))
        }
        try:
            listing = module_listing(cubins)
        except RuntimeError:
            pass  # no listing kept: a count of this candidate is unknown, never qualified
        else:
            (prepared / LISTING_FILE).write_text(listing, encoding="utf-8")
    except BaseException:
        shutil.rmtree(prepared, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(run, ignore_errors=True)
    return Prepared(
        str(prepared / MODULE_FILE),
        entry,
        facts,
        seconds=time.perf_counter() - started,
        folder=prepared,
    )


def _failure(code: int | None, output: str, run: Path, timeout_s: float) -> tuple[Status, str]:
    """The verdict on a compile run that did not succeed."""
    if code is None:
        return (
            Status.TIMEOUT,
            f"compiling and autotuning the kernels (the entry's first call on each workload) "
            f"took more than {timeout_s:.0f} s",
        )
    try:
        result = json.loads(
            (run / RESULT_FILE).read_text(encoding="utf-8")[: 4 * _MAX_MESSAGE_CHARS]
        )
        message = str(result["message"])
    except (OSError, ValueError, KeyError, TypeError):
        message = ""
    if code == EXIT_COMPILE_ERROR and message:
        return Status.COMPILE_ERROR, f"a Triton kernel did not compile: {message}"
    if code == EXIT_RUNTIME_ERROR and message:
        return Status.RUNTIME_ERROR, f"the entry failed while its kernels were compiled: {message}"
    tail = output[-_TAIL_CHARS:].replace(str(run) + "/", "")
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return Status.RUNTIME_ERROR, f"the run compiling the kernels {how}: {tail}"


def _snapshot(source: Path, target: Path) -> str | None:
    """Copy the regular files of the run's cache (never a link), keeping their places; why not,
    when it holds more than a snapshot may."""
    files, total = [], 0
    for folder, _, names in os.walk(source):
        for name in names:
            path = Path(folder) / name
            status = path.lstat()
            if not stat.S_ISREG(status.st_mode):
                continue
            files.append(path)
            total += status.st_size
            if len(files) > MAX_CACHE_FILES or total > MAX_CACHE_BYTES:
                return (
                    f"the compile run left more than {MAX_CACHE_FILES:,} files or "
                    f"{MAX_CACHE_BYTES >> 20} MiB in its Triton cache"
                )
    for path in files:
        copy = target / path.relative_to(source)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, copy, follow_symlinks=False)
    target.mkdir(parents=True, exist_ok=True)
    return None


def _message(exc: BaseException, folder: Path) -> str:
    """An exception as the model reads it: its type and text, without this run's folder or the
    commands Triton prints to reproduce a ptxas failure (host paths)."""
    lines = [
        line
        for line in f"{type(exc).__name__}: {exc}".replace(str(folder) + "/", "").splitlines()
        if "Repro command" not in line
    ]
    text = "\n".join(lines).strip()
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[:_MAX_MESSAGE_CHARS] + " ..."


def run_compile(spec_path: str) -> int:
    """The run itself: confine, make the CUDA context, import the module, and call the entry
    once on each workload, holding the GPU shared."""
    folder = Path.cwd()
    spec = json.loads(Path(spec_path).read_text())
    # Before anything of the candidate's: the worker's confinement, with ptxas and the C
    # compiler the only programs that may be started.
    locks = [Path(spec[name]).parent for name in ("gpu_lock", "startup_lock") if spec[name]]
    confine(folder, programs=compiler_programs(), extra_readable=locks)
    os.environ.update(environment(folder, spec["facts"]))
    from ptxgym.evaluate.worker import allocate_outputs, make_inputs

    task = Task.model_validate(spec["task"])
    initialize_driver()
    startup_lock = Path(spec["startup_lock"]) if spec["startup_lock"] else None
    with startup_hold(startup_lock):
        make_context(0)  # the run sees only its GPU (CUDA_VISIBLE_DEVICES)
    seal(network=False, processes=True)
    import torch

    try:
        entry = TritonEntry(str(folder / MODULE_FILE), task, spec["facts"], compiles=True)
        stream = torch.cuda.Stream()
        with holding(Path(spec["gpu_lock"]), exclusive=False):
            for workload in spec["workloads"]:
                axes = {**task.definition.const_axes, **workload["axes"]}
                inputs = make_inputs(task, workload, int(spec["seed"]), False)
                outputs = allocate_outputs(task, axes)
                torch.cuda.synchronize()
                entry(inputs, outputs, axes, stream.cuda_stream)
                torch.cuda.synchronize()
                del inputs, outputs
    except Exception as exc:
        kind = EXIT_COMPILE_ERROR if type(exc).__name__ in _COMPILE_ERRORS else EXIT_RUNTIME_ERROR
        result = {"message": _message(exc, folder)}
        (folder / RESULT_FILE).write_text(json.dumps(result), encoding="utf-8")
        return kind
    return 0


def _main(arguments: list[str]) -> int:
    if len(arguments) != 1:
        print("usage: python -m ptxgym.evaluate.compile_run SPEC.json", file=sys.stderr)
        return 2
    return run_compile(arguments[0])


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
