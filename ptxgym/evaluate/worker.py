"""The untrusted worker: loads one candidate library, runs it, and reports what it produced.

The job says how the candidate is loaded (its language's entry kind, ``load_entry``): a shared
library's C entry through ctypes, or a Triton module whose kernels its compile run compiled
(``ptxgym.evaluate.compile_run``), called with torch tensors on the worker's stream.

A worker serves exactly one evaluation and exits; a fresh one is started for the next, so no state
(static caches, a corrupted CUDA context, threads left running) survives from one candidate to
another. It never receives reference outputs or baseline timings: it generates the inputs itself
from the seeds it is given, with the task's trusted input generator, and sends the outputs back to
the judge, which holds the references. It speaks the judge's protocol
(``ptxgym.evaluate.worker_protocol``): the outputs of each correctness stage; in the timed loop a
word before and after every call, the outputs of the calls the judge keeps (told only once each call
is over), and every timed call's device time; then ``done``. Its stdout and stderr go to a log file
the judge reads after a crash.
"""

from __future__ import annotations

import ctypes
import faulthandler
import importlib
import os
import re
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ptxgym.device.gpus import initialize_driver, make_context
from ptxgym.device.lock import startup_hold
from ptxgym.evaluate.correctness import INTEGER_POISON
from ptxgym.evaluate.timing import Timer
from ptxgym.languages.base import ENTRY_C_ABI, ENTRY_TRITON
from ptxgym.sandbox import channel
from ptxgym.sandbox.isolation import confine, seal
from ptxgym.tasks import Task

if TYPE_CHECKING:
    import numpy
    import torch
    from numpy.typing import NDArray

# What a worker imports before its job (Python's part of its start-up): a judge that forks its
# workers (JudgeSettings.fork_workers) has them imported once, in the process it forks them
# from. Importing them touches no GPU: CUDA starts in the worker.
WORKER_IMPORTS = ("torch", "ptxgym.evaluate.worker")
_POISON = float("nan")


def resolve_callable(reference: str) -> Callable[..., Any]:
    """Import ``module:function``."""
    module, function = reference.split(":")
    target: Callable[..., Any] = getattr(importlib.import_module(module), function)
    return target


def make_inputs(
    task: Task, workload: dict[str, Any], seed: int, outliers: bool
) -> dict[str, torch.Tensor]:
    """The task's inputs for one workload and seed (identical in the judge and the worker)."""
    generate = resolve_callable(task.callables.inputs)
    inputs: dict[str, torch.Tensor] = generate(
        {**task.definition.const_axes, **workload["axes"]},
        seed=seed,
        device="cuda",
        outliers=outliers,
        **task.callables.params,
        **workload["sequences"],
    )
    return inputs


def host_bytes(tensors: Mapping[str, torch.Tensor]) -> dict[str, NDArray[numpy.uint8]]:
    """Each tensor's bytes, in its memory order, copied to host memory: inputs for a single-call
    program (``ptxgym.evaluate.single_call``), which copies them to its GPU as they are."""
    import torch

    copies = {
        name: tensor.contiguous().view(-1).view(torch.uint8).cpu().numpy()
        for name, tensor in tensors.items()
    }
    for array in copies.values():
        array.setflags(write=False)  # shared by the evaluations that hand them to their runs
    return copies


def host_inputs(task: Task, workload: dict[str, Any], seed: int) -> dict[str, NDArray[numpy.uint8]]:
    """The task's inputs for one workload and seed (no outliers), in host memory."""
    return host_bytes(make_inputs(task, workload, seed, False))


def allocate_outputs(task: Task, axes: dict[str, int]) -> dict[str, torch.Tensor]:
    """Output buffers of the definition's shapes and dtypes, poisoned."""
    import torch

    outputs = {}
    for name, spec in task.definition.outputs.items():
        shape = [axes[a] for a in spec.shape]
        dtype = getattr(torch, spec.dtype)  # task dtypes are named as torch names them
        outputs[name] = torch.empty(shape, dtype=dtype, device="cuda")
    poison(outputs)
    return outputs


def poison(outputs: dict[str, torch.Tensor]) -> None:
    for tensor in outputs.values():
        if tensor.is_floating_point():
            tensor.fill_(_POISON)
        else:
            tensor.fill_(INTEGER_POISON[tensor.element_size()])


class DeviceBuffer(Protocol):
    """What the entry point is handed a buffer as: a torch tensor, or a single-call program's
    own allocation (``ptxgym.evaluate.single_call.DriverContext``)."""

    def data_ptr(self) -> int: ...


class Entry:
    """The candidate's C entry point, bound with ctypes to the task's signature."""

    def __init__(self, library: str, task: Task) -> None:
        self.task = task
        self.library = ctypes.CDLL(library, mode=ctypes.RTLD_LOCAL)
        self.function = getattr(self.library, task.entry_point.symbol)
        pointers = len(task.definition.inputs) + len(task.definition.outputs)
        self.function.argtypes = (
            [ctypes.c_void_p] * pointers
            + [ctypes.c_int] * len(task.entry_point.axes)
            + [ctypes.c_void_p]
        )
        self.function.restype = ctypes.c_int

    def __call__(
        self,
        inputs: Mapping[str, DeviceBuffer],
        outputs: Mapping[str, DeviceBuffer],
        axes: Mapping[str, int],
        stream: int,
    ) -> int:
        definition = self.task.definition
        arguments: list[Any] = [inputs[name].data_ptr() for name in definition.inputs]
        arguments += [outputs[name].data_ptr() for name in definition.outputs]
        arguments += [axes[name] for name in self.task.entry_point.axes]
        return int(self.function(*arguments, stream))


class EntryPoint(Protocol):
    """A loaded candidate's entry, whatever its language: called with the input and output
    buffers, the axes and the stream to launch on; returns 0 or a CUDA error code (a Triton
    entry raises instead)."""

    def __call__(
        self,
        inputs: Mapping[str, DeviceBuffer],
        outputs: Mapping[str, DeviceBuffer],
        axes: Mapping[str, int],
        stream: int,
    ) -> int: ...


def load_entry(
    kind: str, library: str, task: Task, facts: Mapping[str, str] | None = None
) -> EntryPoint:
    """The candidate at ``library`` loaded as the language's entry ``kind`` says
    (``ptxgym.languages.base``): a C entry through ctypes, or a Triton module (told ``facts``,
    ``ptxgym.languages.triton.runtime.host_facts``), whose kernels its compile run compiled."""
    if kind == ENTRY_C_ABI:
        return Entry(library, task)
    if kind == ENTRY_TRITON:
        from ptxgym.languages.triton.runtime import TritonEntry

        return TritonEntry(library, task, facts or {})
    raise ValueError(f"unknown entry kind {kind!r}")


def error_name(code: int) -> str:
    try:
        from cuda.bindings import runtime

        name = runtime.cudaGetErrorName(runtime.cudaError_t(code))[1]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        return f"error {code}"


def worker_main(
    conn: Connection,
    device: int,
    log_path: str,
    home: str,
    startup_lock: str | None,
    use_cupti: bool = True,
) -> None:
    """Process entry: set up, report ready, serve one job, exit. ``startup_lock``: the GPU's
    start-up lock file, held shared while the CUDA context is made
    (``ptxgym.device.lock.startup_hold``; None: made without the lock). ``use_cupti``: time
    with CUPTI (the judge's settings)."""
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    # Before anything of the candidate's can run: a scrubbed environment, its own folder, file
    # and core limits (a printf flood ends the worker with SIGXFSZ, a RUNTIME_ERROR), and no
    # network where the OS allows.
    isolation = confine(Path(home))
    faulthandler.enable()

    # CUDA and CUPTI start sharing the GPU: a context made beside a timing moves it
    # (ptxgym.device.lock). The judge holds the GPU alone for this worker from the job on
    # (correctness and timing) until the worker is gone.
    initialize_driver()  # outside the lock: loading the driver puts nothing on the GPU
    with startup_hold(Path(startup_lock) if startup_lock else None):
        make_context(device)
        timer = Timer(use_cupti=use_cupti)
    # CUDA, torch and CUPTI are up: from here on no new processes, no signals to others, no sockets
    # but the judge's kind (ptxgym.sandbox.seccomp), for the candidate's code and ours alike.
    isolation["system_calls_filtered"] = seal(network=False)
    # How this worker times (said before any candidate code is loaded): the judge compares it
    # with how it timed the baselines.
    method = "cupti" if timer.cupti is not None else "host-sync"
    ready = {"kind": "ready", "pid": os.getpid(), "isolation": isolation, "timing_method": method}
    channel.send(conn, ready)
    job, _ = channel.receive(conn)
    # The judge hands over a shared-memory region for the outputs right after the job.
    arena = channel.Arena.attach(conn, int(job["arena_bytes"])) if job.get("arena_bytes") else None
    if arena is not None:
        arena.pin()  # outputs copied into it by DMA (channel.Arena.pin); pageable if refused
    try:
        _serve(conn, job, timer, arena)
    except Exception as exc:  # the candidate broke the CUDA context, or raised through ctypes
        channel.send(conn, {"kind": "error", "message": error_text(exc)})
    conn.close()


# torch's out-of-memory text names every other process on the GPU with its PID and memory use:
# of it, only the size asked for is passed on.
_OUT_OF_MEMORY_RE = re.compile(r"Tried to allocate ([\d.]+ [KMGT]?i?B)")


def error_text(exc: BaseException) -> str:
    """What the feedback says of an exception in the worker: its type and first line, or, for
    running out of GPU memory, only how much was asked for."""
    if type(exc).__name__ == "OutOfMemoryError":
        asked = _OUT_OF_MEMORY_RE.search(str(exc))
        size = f" (tried to allocate {asked.group(1)})" if asked else ""
        return f"OutOfMemoryError: the GPU ran out of memory{size}"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


class _EntryPointFailed(Exception):
    """The candidate's entry point returned an error code: the worker says so and stops."""


def _serve(
    conn: Connection, job: dict[str, Any], timer: Timer, arena: channel.Arena | None
) -> None:
    import torch

    task = Task.model_validate(job["task"])
    entry = load_entry(job.get("entry", ENTRY_C_ABI), job["library"], task, job.get("facts"))
    stream = torch.cuda.Stream()
    try:
        for workload in job["workloads"]:
            axes = {**task.definition.const_axes, **workload["axes"]}
            for stage in workload["checks"]:
                inputs = make_inputs(task, workload, stage["seed"], stage["outliers"])
                pristine = {name: tensor.clone() for name, tensor in inputs.items()}
                outputs = allocate_outputs(task, axes)
                torch.cuda.synchronize()
                with torch.cuda.stream(stream):
                    code = entry(inputs, outputs, axes, stream.cuda_stream)
                torch.cuda.synchronize()
                _succeeded(code, "")
                modified = [n for n in inputs if not torch.equal(inputs[n], pristine[n])]
                channel.send(
                    conn,
                    {
                        "kind": "check",
                        "workload": workload["name"],
                        "stage": stage["name"],
                        "modified_inputs": modified,
                    },
                    outputs,
                    arena,
                )
                del inputs, pristine, outputs
                _judges_answer(conn, "continue")
        for workload in job["workloads"]:
            _time_workload(conn, task, entry, workload, job, timer, stream, arena)
    except _EntryPointFailed as failure:
        channel.send(conn, {"kind": "error", "message": str(failure)})
    else:
        channel.send(conn, {"kind": "done"})


def _succeeded(code: int, when: str) -> None:
    """Nothing if the entry point returned 0; an _EntryPointFailed naming the code otherwise."""
    if code != 0:
        raise _EntryPointFailed(f"the entry point returned {code} ({error_name(code)}){when}")


def _judges_answer(conn: Connection, *kinds: str) -> str:
    """The judge's answer to the message just sent, which must be one of ``kinds``."""
    kind = channel.receive(conn)[0].get("kind")
    if kind not in kinds:
        raise channel.ChannelError(f"the judge answered {kind!r}, expected one of {kinds}")
    return str(kind)


def _time_workload(
    conn: Connection,
    task: Task,
    entry: EntryPoint,
    workload: dict[str, Any],
    job: dict[str, Any],
    timer: Timer,
    stream: Any,
    arena: channel.Arena | None,
) -> None:
    """Time the candidate on fresh inputs for every call. Outside the measured window, each call
    is reported to the judge right before it starts and once it is over; the judge answers the
    second with ``keep`` for a call whose outputs it checks, and they go to it at once. Then the
    timing: every timed call's device time."""
    import torch

    name = workload["name"]
    axes = {**task.definition.const_axes, **workload["axes"]}
    base_seed = int(workload["timing"]["seed"])
    outputs = allocate_outputs(task, axes)
    current: dict[str, dict[str, torch.Tensor]] = {}
    codes: list[int] = []

    def prepare(i: int) -> None:
        # The timer synchronised the device after the previous call: its inputs may be freed
        # and its outputs poisoned.
        current["inputs"] = make_inputs(task, workload, base_seed + i, False)
        poison(outputs)

    def call(i: int) -> None:
        with torch.cuda.stream(stream):
            codes.append(entry(current["inputs"], outputs, axes, stream.cuda_stream))

    def before(i: int) -> None:
        channel.send(conn, {"kind": "calling", "workload": name, "call": i})

    def after(i: int) -> None:
        _succeeded(codes[-1], " while being timed")
        channel.send(conn, {"kind": "ran", "workload": name, "call": i})
        if _judges_answer(conn, "keep", "next") == "keep":
            header = {"kind": "timed-check", "workload": name, "call": i}
            channel.send(conn, header, outputs, arena)
            _judges_answer(conn, "continue")

    result = timer.measure(
        call,
        prepare,
        warmup=job["warmup"],
        iters=job["iters"],
        trials=job["trials"],
        before=before,
        after=after,
    )
    del current["inputs"]
    channel.send(
        conn,
        {
            "kind": "timing",
            "workload": name,
            "method": result.method,
            "call_ms": list(result.call_ms),
            "phase_seconds": result.phase_seconds,
        },
    )
    _judges_answer(conn, "continue")
