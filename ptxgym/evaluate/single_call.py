"""One call of a candidate on one input set, as a program of its own, started ahead of time.

The Nsight Compute profile and compute-sanitizer both need the candidate to run under a tool that
starts the process itself, so neither can reuse the worker. This module is that process: it copies
one input set, made by the caller with the task's trusted generator
(``ptxgym.evaluate.worker.host_bytes``), to the GPU, allocates poisoned outputs, and calls the
candidate once between ``cuProfilerStart`` and ``cuProfilerStop`` (so a profiler started with
``--profile-from-start off`` sees only the candidate's own launches). It never sees references. It
talks to CUDA through the driver API (``DriverContext``), not torch: importing torch was most of a
run's start-up CPU time, which bounds 16 trajectories on the H200 host (docs/benchmarks.md, tenth
session).

Most of such a run is still start-up (the tool, Python, the CUDA context under the tool), so the
judge keeps runs started ahead of need (``PendingCall``), not yet bound to a candidate, as it keeps
workers. A waiting run has made its CUDA context (holding the GPU's start-up lock shared:
``ptxgym.device.lock``, unless ``JudgeSettings.lock_startups`` is off), and does nothing until the
word: ``go``, with the job (the candidate's library, its task, and the input files the judge wrote
into the run's folder), or ``stop``. After ``go`` it reads the inputs, then holds the GPU (alone
for a profile run, else shared) to copy them, load the candidate and call it (a profile run
profiles the call in its turn: ``ptxgym.device.lock.profiler_turn``). It runs with a scrubbed
environment in a folder of its own, and gives up waiting when the judge is gone.

A Triton candidate (the job's entry kind) is imported before the GPU is held, with a copy of its
compiled cache beside it (``hand_candidate``); the run wraps its own allocations as tensors, and
records which cubins the call loaded (``LOADED_FILE``) for the count's join.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ptxgym.device.gpus import initialize_driver, physical_device
from ptxgym.device.lock import (
    ensure_lock_file,
    gpu_lock_for,
    holding,
    profiler_lock_path,
    profiler_turn,
    startup_hold,
    startup_lock_for,
)
from ptxgym.evaluate.cupti_helper import THREAD_METRIC, WARP_METRIC, SassCounter
from ptxgym.evaluate.timing import seconds_into
from ptxgym.languages.base import ENTRY_C_ABI, ENTRY_TRITON
from ptxgym.languages.triton.build import MODULE_FILE as TRITON_MODULE
from ptxgym.languages.triton.runtime import CACHE_FOLDER
from ptxgym.sandbox.isolation import (
    hand_library,
    limit_resources,
    python_environment,
    readable_paths,
    restrict_files,
    seal,
)
from ptxgym.sandbox.processes import POLL_S, ProcessGroup, wait_for_word
from ptxgym.tasks import Task

if TYPE_CHECKING:
    import numpy
    from numpy.typing import NDArray

    from ptxgym.languages.triton.runtime import TritonEntry

T = TypeVar("T")
EXIT_ENTRY_FAILED = 3  # the entry point returned a CUDA error
EXIT_NOT_WANTED = 4  # told to stop, or the judge went away, before the call
# The line on which the program says where its seconds went (``call_seconds``).
SECONDS_MARK = "ptxgym-single-call-seconds "
# Its parts, in order (``call_seconds``).
# The judge's own account of a run's seconds (``PendingCall.seconds``), beside the run's.
JUDGE_SIDE_KEYS = ("handover", "until_end")
CALL_SECONDS_KEYS = (
    "driver",
    "context",
    "ready",
    "read",
    "gpu_wait",
    "profiler_wait",
    "inputs",
    "load",
    "call",
    "count",
    "gpu",
)
# Where a count run writes its counts, in its own folder: one row per instruction counted,
# [function symbol, offset, warp-level executions, threads with the predicate on].
COUNTS_FILE = "counts.json"
# Where a Triton candidate's run lists the cubins of its Triton cache that its call loaded.
LOADED_FILE = "loaded.json"
_CU_STREAM_NON_BLOCKING = 1
# The worker's poison for outputs (NaN; -0x7EADBEEF for integers) as the bit pattern a memset
# writes: element bytes and pattern, per dtype.
_POISON_PATTERNS = {
    "bfloat16": (2, 0x7FC0),
    "float16": (2, 0x7E00),
    "float32": (4, 0x7FC0_0000),
    "int32": (4, -0x7EAD_BEEF & 0xFFFF_FFFF),
    "int8": (1, 0x80),
    "float8_e4m3fn": (1, 0x7F),
}


@dataclass(frozen=True)
class CallJob:
    """What one call is: the candidate's library, the task it is for, and one input set."""

    task: Task
    library: str
    workload: Mapping[str, Any]  # axes and sequences of one workload
    # Each input's bytes, made with the task's trusted generator
    # (ptxgym.evaluate.worker.host_bytes).
    inputs: Mapping[str, NDArray[numpy.uint8]]
    # How the library is loaded and called (the language's entry kind), and what a Triton entry
    # is told (ptxgym.evaluate.compile_run.Prepared).
    entry: str = ENTRY_C_ABI
    facts: Mapping[str, str] = field(default_factory=dict)

    def to_json(self, input_files: Mapping[str, str], library: str) -> str:
        """The job as the program reads it, its inputs in ``input_files`` (name: path) and the
        candidate's library at ``library``."""
        return json.dumps(
            {
                "task": self.task.model_dump(mode="json"),
                "library": library,
                "entry": self.entry,
                "facts": dict(self.facts),
                "workload": dict(self.workload),
                "inputs": dict(input_files),
            }
        )


class PendingCall:
    """A single-call program started under a tool ahead of need, not yet bound to a candidate:
    ``run`` hands it a job and the word; ``cancel`` drops it."""

    def __init__(
        self,
        *,
        device: int,
        prefix: str,
        under_profiler: bool = False,
        lock_startup: bool = True,
        counter: Path | None = None,
        exclusive: bool = True,
    ) -> None:
        """``under_profiler``: a run under Nsight Compute, which profiles its call only in its
        turn (``ptxgym.device.lock.profiler_turn``). ``lock_startup``: it makes its CUDA context
        holding the GPU's start-up lock shared (``JudgeSettings.lock_startups``).
        ``counter``: the CUPTI helper (``ptxgym.evaluate.cupti_helper``), with which the run
        counts the executed SASS instructions of its call into ``COUNTS_FILE``. ``exclusive``:
        the call holds the GPU alone; else shared, beside other shared holders and never beside
        a timing (a count run: its counts do not depend on what else runs)."""
        self.folder = Path(tempfile.mkdtemp(prefix=prefix))
        self.device = device
        self._go = self.folder / "go"
        self._stop = self.folder / "stop"
        self._job = self.folder / "job.json"
        self._taken = self.folder / "gpu-taken"
        profiler_lock = str(ensure_lock_file(profiler_lock_path())) if under_profiler else None
        spec = {
            "gpu_lock": gpu_lock_for(device),
            # Held shared while the context is made (None: without the lock).
            "startup_lock": startup_lock_for(device, lock_startup),
            "go": str(self._go),
            "stop": str(self._stop),
            "job": str(self._job),
            "taken": str(self._taken),
            "judge_pid": os.getpid(),
            # A run under Nsight Compute takes turns with the machine's other profile runs to
            # profile (None: under another tool).
            "profiler_lock": profiler_lock,
            # A copy of the CUPTI helper in the run's folder, the only one of ours it may read.
            "counter": hand_library(str(counter), self.folder, "sass_counts.so")
            if counter
            else None,
            "exclusive": exclusive,
        }
        spec_path = self.folder / "spec.json"
        spec_path.write_text(json.dumps(spec))
        self.program = [sys.executable, "-m", "ptxgym.evaluate.single_call", str(spec_path)]
        self.group: ProcessGroup | None = None
        self.judge_seconds: dict[str, float] = {}

    def start(self, command: list[str], environment: Mapping[str, str] | None = None) -> None:
        """Start ``command`` (the tool, ending with ``self.program``) in a scrubbed environment
        (plus ``environment``) with the folder as working directory."""
        self.group = ProcessGroup(
            command,
            env={
                **python_environment(self.folder),
                "CUDA_VISIBLE_DEVICES": physical_device(self.device),
                **(environment or {}),
            },
            cwd=self.folder,
        )

    def run(self, job: CallJob, timeout_s: float) -> tuple[int | None, str]:
        """Hand over the job, give the word, and wait for the end: exit code (None past the
        deadline) and output."""
        assert self.group is not None, "start() first"
        started = time.perf_counter()
        self.hand_over(job)
        handed = time.perf_counter()
        ended = self.group.wait(timeout_s)
        self.judge_seconds = {
            "handover": handed - started,
            "until_end": time.perf_counter() - handed,
        }
        return ended

    def seconds(self, output: str) -> dict[str, float]:
        """Where the run's seconds went: its own account (``call_seconds``) and the judge's,
        ``handover`` (writing the job and its input files) and ``until_end`` (from the word to
        the program's end, its tool's report and exit included)."""
        return {**call_seconds(output), **self.judge_seconds}

    def hand_over(self, job: CallJob) -> None:
        """Write the job and its input files into the folder, then give the word."""
        files = {}
        for index, (name, data) in enumerate(job.inputs.items()):
            # In the run's own folder, whose writes other runs' candidates are denied where
            # Landlock confines them (not from the CUDA driver's threads: docs/security.md);
            # they go with the folder.
            path = self.folder / f"input-{index}.bin"
            path.write_bytes(data.data)
            files[name] = str(path)
        # Complete before the word: the program reads it then.
        library = hand_candidate(job.library, self.folder, job.entry)
        self._job.write_text(job.to_json(files, library))
        self._go.touch()

    def wait_until_gpu_taken(self, timeout_s: float) -> None:
        """Return once the program holds the GPU alone for its call (or has ended, or
        ``timeout_s`` passed): another run given its word after this one queues behind it."""
        deadline = time.monotonic() + timeout_s
        while not self._taken.exists() and self.alive and time.monotonic() < deadline:
            time.sleep(POLL_S)

    @property
    def alive(self) -> bool:
        """Still waiting (or running): not ended by a failed start-up or the judge."""
        return self.group is not None and self.group.process.poll() is None

    def cancel(self) -> None:
        """Tell the program the call is not wanted, and make sure the group is gone."""
        self._stop.touch()
        if self.group is not None:
            self.group.kill()

    def close(self) -> None:
        """Cancel if still waiting, and remove the folder (with anything the tool wrote)."""
        if self.alive:
            self.cancel()
        shutil.rmtree(self.folder, ignore_errors=True)


def hand_candidate(library: str, folder: Path, entry: str) -> str:
    """A copy of a prepared candidate in a confined process's own ``folder`` (its library; for
    Triton the module and its compiled cache, which Triton finds beside it): the path the
    process loads."""
    if entry == ENTRY_C_ABI:
        return hand_library(library, folder)
    source = Path(library).parent
    copy = hand_library(library, folder, TRITON_MODULE)
    shutil.copytree(source / CACHE_FOLDER, folder / CACHE_FOLDER, dirs_exist_ok=True)
    return copy


# The spec's lock files, which the program takes after its files are confined.
_LOCK_FILES = ("gpu_lock", "startup_lock", "profiler_lock")


def run_job(spec_path: str) -> int:
    """Start up, wait for the word and the job, then copy the inputs and call the candidate."""
    # A printf flood ends this process instead of filling the disk (as in the worker).
    limit_resources()
    spec = json.loads(Path(spec_path).read_text())
    from ptxgym.evaluate.worker import EntryPoint, load_entry

    gpu_lock = Path(spec["gpu_lock"])
    # The start-up (Python, the driver with the tool's injection, the CUDA context under the
    # tool) happens ahead of need, so that after the word only the call is left. The context is
    # made holding the GPU's start-up lock shared: a context made beside a timing moves it
    # (ptxgym.device.lock).
    # Nothing else touches the GPU before the word: inputs made ahead, by every waiting run,
    # held the GPU long enough to keep timings waiting (docs/benchmarks.md, fourth session), and
    # no candidate code is loaded before it.
    seconds: dict[str, float] = {}
    with seconds_into(seconds, "driver"):  # outside the lock: loading it puts nothing on the GPU
        initialize_driver()
    startup_lock = Path(spec["startup_lock"]) if spec["startup_lock"] else None
    counter = None
    with seconds_into(seconds, "context"), startup_hold(startup_lock):
        cuda = DriverContext()  # the run sees only its GPU (CUDA_VISIBLE_DEVICES)
        if spec["counter"]:
            # CUPTI's set-up (about 0.1 s) ahead of need too, before any candidate code.
            counter = SassCounter(Path(spec["counter"]))
            counter.prepare(device=0)
    # The tools talk to this process over sockets, so those stay; the rest of the filter holds.
    seal(network=True)
    # Writes only in this call's folder, reads only of it, the system's, Python's and CUDA's
    # files and the lock files the spec names (the judge's lock folder, whatever this
    # process's environment says) from here on (the tool's own processes write the report).
    locks = [Path(spec[name]).parent for name in _LOCK_FILES if spec[name]]
    restrict_files(Path.cwd(), [*readable_paths(), *locks])
    with seconds_into(seconds, "ready"):  # about 0 when the word came before the start-up was done
        if not wait_for_word(Path(spec["go"]), int(spec["judge_pid"]), stop=Path(spec["stop"])):
            return EXIT_NOT_WANTED
    job = json.loads(Path(spec["job"]).read_text())
    task = Task.model_validate(job["task"])
    axes = {**task.definition.const_axes, **job["workload"]["axes"]}
    with seconds_into(seconds, "read"):  # before the GPU is held: only the copies need it
        data = {name: Path(job["inputs"][name]).read_bytes() for name in task.definition.inputs}
    triton: TritonEntry | None = None
    if job["entry"] == ENTRY_TRITON:
        # Imported before the GPU is held: torch's and Triton's imports are seconds of CPU, and
        # the module's own code runs nothing on the GPU (its module level holds only constants,
        # ptxgym.languages.triton.policy); its kernels load when they are first launched.
        from ptxgym.languages.triton.runtime import TritonEntry

        with seconds_into(seconds, "load"):
            triton = TritonEntry(job["library"], task, job["facts"])
    # A profile run's call has the GPU to itself: Nsight Compute's runs sharing the GPU made a
    # step slower, not faster, on the H200 (docs/benchmarks.md, third session). A sanitizer's
    # and a count run's hold it shared (``exclusive`` false): what memcheck finds and what
    # CUPTI counts do not depend on what else runs, and neither runs beside a timing. No call
    # holds the start-up lock (a timing's alone): a context made in another process changes no
    # count the profiler takes.
    started = time.perf_counter()
    profiler_lock = Path(spec["profiler_lock"]) if spec["profiler_lock"] else None
    with holding(gpu_lock, exclusive=spec["exclusive"]) as waited, contextlib.ExitStack() as turn:
        # Said before any of the candidate's code is loaded, so the candidate cannot say it.
        Path(spec["taken"]).touch()
        if profiler_lock is not None:
            # Also before the candidate's code is loaded, which could otherwise take it first.
            seconds["profiler_wait"] = turn.enter_context(profiler_turn(profiler_lock))
        with seconds_into(seconds, "inputs"):
            inputs = {name: cuda.upload(data.pop(name)) for name in task.definition.inputs}
            outputs = {
                name: cuda.poisoned(math.prod(axes[axis] for axis in output.shape), output.dtype)
                for name, output in task.definition.outputs.items()
            }
            stream = cuda.stream()
            cuda.synchronize()
        with seconds_into(seconds, "load"):
            if counter is not None:
                counter.enable()  # each kernel is patched when it first runs, from here on
            entry: EntryPoint = triton or load_entry(job["entry"], job["library"], task)
        with seconds_into(seconds, "call"):
            code = profiled(cuda, lambda: entry(inputs, outputs, axes, stream))
        if triton is not None:
            # Which of the cache's cubins ran: the count joins its rows with their listing only.
            Path(LOADED_FILE).write_text(json.dumps(triton.cubins))
        if counter is not None:
            with seconds_into(seconds, "count"):
                records = counter.collect()
                counter.disable()
            rows = [
                [r.function, r.pc, r.values[WARP_METRIC], r.values[THREAD_METRIC]] for r in records
            ]
            Path(COUNTS_FILE).write_text(json.dumps(rows))
    seconds["gpu_wait"] = waited
    seconds["gpu"] = time.perf_counter() - started - waited
    # Last, after anything the candidate printed: the judge reads the last such line.
    print(SECONDS_MARK + json.dumps(seconds), flush=True)
    return 0 if code == 0 else EXIT_ENTRY_FAILED


@dataclass(frozen=True)
class Allocation:
    """A buffer of the program's on the GPU, as the entry point is handed it."""

    pointer: int

    def data_ptr(self) -> int:
        return self.pointer


class DriverContext:
    """This process's CUDA context through the driver API (ctypes on libcuda): the primary
    context of device 0, which the candidate's CUDA runtime then finds and uses too. Every call
    is checked: a failure raises, which ends the program (an unknown tool result)."""

    def __init__(self) -> None:
        self._cuda = ctypes.CDLL("libcuda.so.1")
        self._check("cuInit", 0)
        device = ctypes.c_int()
        self._check("cuDeviceGet", ctypes.byref(device), 0)
        context = ctypes.c_void_p()
        self._check("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
        self._check("cuCtxSetCurrent", context)

    def _check(self, function: str, *arguments: object) -> None:
        code = getattr(self._cuda, function)(*arguments)
        if code != 0:
            name = ctypes.c_char_p()
            self._cuda.cuGetErrorName(code, ctypes.byref(name))
            raise RuntimeError(f"{function}: CUDA error {code} ({(name.value or b'?').decode()})")

    def allocate(self, nbytes: int) -> Allocation:
        pointer = ctypes.c_uint64()
        self._check("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(max(nbytes, 1)))
        return Allocation(pointer.value)

    def upload(self, data: bytes) -> Allocation:
        """A new buffer holding ``data``."""
        buffer = self.allocate(len(data))
        self._check(
            "cuMemcpyHtoD_v2", ctypes.c_uint64(buffer.pointer), data, ctypes.c_size_t(len(data))
        )
        return buffer

    def poisoned(self, elements: int, dtype: str) -> Allocation:
        """A new buffer of ``elements`` of ``dtype``, each set to the worker's poison."""
        size, pattern = _POISON_PATTERNS[dtype]
        buffer = self.allocate(elements * size)
        pointer, count = ctypes.c_uint64(buffer.pointer), ctypes.c_size_t(elements)
        if size == 1:
            self._check("cuMemsetD8_v2", pointer, ctypes.c_ubyte(pattern), count)
        elif size == 2:
            self._check("cuMemsetD16_v2", pointer, ctypes.c_ushort(pattern), count)
        else:
            self._check("cuMemsetD32_v2", pointer, ctypes.c_uint(pattern), count)
        return buffer

    def stream(self) -> int:
        """A new stream (its handle, as the entry point takes it)."""
        stream = ctypes.c_void_p()
        # Non-blocking, as the worker's torch streams are: no implicit sync with stream 0.
        self._check("cuStreamCreate", ctypes.byref(stream), _CU_STREAM_NON_BLOCKING)
        return stream.value or 0

    def synchronize(self) -> None:
        self._check("cuCtxSynchronize")

    def profiler(self, on: bool) -> None:
        self._check("cuProfilerStart" if on else "cuProfilerStop")


def profiled(cuda: DriverContext, launch: Callable[[], T]) -> T:
    """``launch()`` between ``cuProfilerStart`` and ``cuProfilerStop``, with the GPU idle before
    and after: a profiler started with ``--profile-from-start off`` sees its launches and
    nothing else."""
    cuda.synchronize()
    cuda.profiler(True)
    result = launch()
    cuda.synchronize()
    cuda.profiler(False)
    return result


def call_seconds(output: str) -> dict[str, float]:
    """Where a run's seconds went, from the last line it printed for the judge. Before the
    word: ``driver`` (loading the driver and the tool's injection, outside the GPU lock),
    ``context`` (making the CUDA context under the tool, waiting for the start-up lock included)
    and ``ready`` (waiting for the word; about 0 when the start-up itself kept the judge
    waiting). After it: ``read`` (the input files), ``gpu_wait`` (waiting to have the GPU
    alone) and ``gpu`` (holding it), made of ``profiler_wait`` (a profile run's wait for its
    turn to profile, ``ptxgym.device.lock.profiler_turn``), ``inputs`` (copying the inputs,
    poisoning the outputs), ``load`` (the candidate's library) and ``call`` (the call under the
    tool: for the profile, its replays). Empty when there is no such line (the run failed before
    its end). For the stage breakdown only: nothing is judged on it."""
    for line in reversed(output.splitlines()):
        if line.startswith(SECONDS_MARK):
            try:
                values = json.loads(line.removeprefix(SECONDS_MARK))
                return {key: float(values[key]) for key in CALL_SECONDS_KEYS if key in values}
            except (ValueError, KeyError, TypeError):
                return {}
    return {}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m ptxgym.evaluate.single_call SPEC.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(run_job(sys.argv[1]))
