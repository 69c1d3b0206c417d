"""One call of a candidate on one input set, as a program of its own, started ahead of time.

The Nsight Compute profile and compute-sanitizer both need the candidate to run under a tool that
starts the process itself, so neither can reuse the worker. This module is that process: it makes
one input set with the task's trusted generator, allocates poisoned outputs, and calls the
candidate once between ``cudaProfilerStart`` and ``cudaProfilerStop`` (so a profiler started with
``--profile-from-start off`` sees only the candidate's own launches). It never sees references.

Most of such a run is start-up (the tool, Python, torch), so the judge starts it together with
the worker's evaluation (``PendingCall``), and the program waits, without touching the GPU,
for the word: ``go`` (the evaluation says the call is wanted) or ``stop``. After ``go`` it takes
the GPU's lock (``ptxgym.gpu_lock``) for its GPU work only: shared for its CUDA context, alone
for the call. It runs with a scrubbed environment in a folder of its own, and gives up waiting
when the judge is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ptxgym.gpu_lock import holding, lock_path
from ptxgym.gpus import physical_device
from ptxgym.isolation import limit_resources, python_environment, restrict_writes, seal
from ptxgym.processes import ProcessGroup, wait_for_word
from ptxgym.tasks import Task

EXIT_ENTRY_FAILED = 3  # the entry point returned a CUDA error
EXIT_NOT_WANTED = 4  # told to stop, or the judge went away, before the call
# The line on which the program says where its seconds after the word went (``call_seconds``).
SECONDS_MARK = "ptxgym-single-call-seconds "
_SECONDS_KEYS = ("context", "gpu_wait", "gpu")


class PendingCall:
    """A single-call program started under a tool, waiting for ``run`` or ``cancel``."""

    def __init__(
        self,
        task: Task,
        library: str,
        workload: Mapping[str, Any],
        seed: int,
        *,
        device: int,
        prefix: str,
    ) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix=prefix))
        self.device = device
        self._go = self.folder / "go"
        self._stop = self.folder / "stop"
        job = {
            "task": task.model_dump(mode="json"),
            "library": library,
            "workload": dict(workload),
            "seed": seed,
            "gpu_lock": str(lock_path(device)),
            "go": str(self._go),
            "stop": str(self._stop),
            "judge_pid": os.getpid(),
        }
        job_path = self.folder / "job.json"
        job_path.write_text(json.dumps(job))
        self.program = [sys.executable, "-m", "ptxgym.single_call", str(job_path)]
        self.group: ProcessGroup | None = None

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

    def run(self, timeout_s: float) -> tuple[int | None, str]:
        """Give the word and wait for the end: exit code (None past the deadline) and output."""
        assert self.group is not None, "start() first"
        self._go.touch()
        return self.group.wait(timeout_s)

    def cancel(self) -> None:
        """Tell the program the call is not wanted, and make sure the group is gone."""
        self._stop.touch()
        if self.group is not None:
            self.group.kill()

    def close(self) -> None:
        """Cancel if still waiting, and remove the folder (with anything the tool wrote)."""
        if self.group is not None and self.group.process.poll() is None:
            self.cancel()
        shutil.rmtree(self.folder, ignore_errors=True)


def run_job(job_path: str) -> int:
    """Wait for the word, then make the inputs and call the candidate once."""
    # A printf flood ends this process instead of filling the disk (as in the worker).
    limit_resources()
    job = json.loads(Path(job_path).read_text())
    import torch  # the slow part of the start-up, done while waiting is still cheap

    from ptxgym.worker import Entry, allocate_outputs, make_inputs

    task = Task.model_validate(job["task"])
    workload = job["workload"]
    axes = {**task.definition.const_axes, **workload["axes"]}
    # Nothing touches the GPU before the word: a run that is not wanted (the candidate failed)
    # costs the GPU nothing. Making the CUDA context and inputs ahead of the word was tried: on
    # the H200 every pending run's start-up under its tool then held the GPU shared, and
    # timings waited behind them (docs/benchmarks.md, fourth session).
    if not wait_for_word(Path(job["go"]), int(job["judge_pid"]), stop=Path(job["stop"])):
        return EXIT_NOT_WANTED
    gpu_lock = Path(job["gpu_lock"])
    # The CUDA context is made sharing the GPU (never during a timing); the call itself has the
    # GPU to itself. Nsight Compute and compute-sanitizer do not overlap well: on the H200, runs
    # sharing the GPU made a step slower, not faster (docs/benchmarks.md, third session).
    started = time.perf_counter()
    with holding(gpu_lock, exclusive=False):
        torch.zeros(1, device="cuda")
    context = time.perf_counter() - started
    # The tools talk to this process over sockets, so those stay; the rest of the filter holds.
    seal(network=True)
    # Writes only in this call's folder from here on (the tool's own processes write the report).
    restrict_writes(Path.cwd())
    started = time.perf_counter()
    with holding(gpu_lock) as waited:
        entry = Entry(job["library"], task)
        inputs = make_inputs(task, workload, int(job["seed"]), False)
        outputs = allocate_outputs(task, axes)
        stream = torch.cuda.Stream()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        with torch.cuda.stream(stream):
            code = entry(inputs, outputs, axes, stream.cuda_stream)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    held = time.perf_counter() - started - waited
    # Last, after anything the candidate printed: the judge reads the last such line.
    seconds = {"context": context, "gpu_wait": waited, "gpu": held}
    print(SECONDS_MARK + json.dumps(seconds), flush=True)
    return 0 if code == 0 else EXIT_ENTRY_FAILED


def call_seconds(output: str) -> dict[str, float]:
    """Where a run's seconds after the word went, from the last line it printed for the judge:
    ``context`` (making the CUDA context under the tool, sharing the GPU), ``gpu_wait`` (waiting
    to have the GPU alone) and ``gpu`` (holding it: loading the candidate, its inputs, the call
    under the tool). Empty when there is no such line (the run failed before its end). For
    the stage breakdown only: nothing is judged on it."""
    for line in reversed(output.splitlines()):
        if line.startswith(SECONDS_MARK):
            try:
                values = json.loads(line.removeprefix(SECONDS_MARK))
                return {key: float(values[key]) for key in _SECONDS_KEYS}
            except (ValueError, KeyError, TypeError):
                return {}
    return {}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m ptxgym.single_call JOB.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(run_job(sys.argv[1]))
