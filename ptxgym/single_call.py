"""One call of a candidate on one input set, as a program of its own.

The Nsight Compute profile and compute-sanitizer both need the candidate to run under a tool that
starts the process itself, so neither can reuse the worker. This module is that process: it makes
one input set with the task's trusted generator, allocates poisoned outputs, and calls the
candidate once between ``cudaProfilerStart`` and ``cudaProfilerStop`` (so a profiler started with
``--profile-from-start off`` sees only the candidate's own launches). It never sees references.

It is started with CUDA_VISIBLE_DEVICES naming the one GPU it may use, and holds that GPU's lock
(``ptxgym.gpu_lock``) only while it runs GPU work. ``write_job`` writes what the program needs;
``python -m ptxgym.single_call JOB`` runs it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ptxgym.gpu_lock import holding, lock_path
from ptxgym.isolation import limit_resources
from ptxgym.tasks import Task

EXIT_ENTRY_FAILED = 3  # the entry point returned a CUDA error


def write_job(
    folder: Path,
    task: Task,
    library: str,
    workload: Mapping[str, Any],
    seed: int,
    *,
    device: int,
) -> Path:
    """Write the job file for one call: the task, the library, the workload, the seed, and the
    lock file of GPU ``device`` (of this process) that the call must hold."""
    job = folder / "job.json"
    job.write_text(
        json.dumps(
            {
                "task": task.model_dump(mode="json"),
                "library": library,
                "workload": dict(workload),
                "seed": seed,
                "gpu_lock": str(lock_path(device)),
            }
        )
    )
    return job


def run_job(job_path: str) -> int:
    """Make the inputs and call the candidate once; 0 when the entry point returned success."""
    # A printf flood ends this process instead of filling the disk (as in the worker).
    limit_resources()
    import torch

    from ptxgym.worker import Entry, allocate_outputs, make_inputs

    job = json.loads(Path(job_path).read_text())
    task = Task.model_validate(job["task"])
    workload = job["workload"]
    axes = {**task.definition.const_axes, **workload["axes"]}
    entry = Entry(job["library"], task)
    torch.zeros(1, device="cuda")  # the CUDA context, made before the GPU is taken
    # The GPU is held only while this process uses it: the tool's and torch's start-up before,
    # and the tool's report after, overlap other evaluations' GPU work.
    with holding(Path(job["gpu_lock"])):
        inputs = make_inputs(task, workload, int(job["seed"]), False)
        outputs = allocate_outputs(task, axes)
        stream = torch.cuda.Stream()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        with torch.cuda.stream(stream):
            code = entry(inputs, outputs, axes, stream.cuda_stream)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    return 0 if code == 0 else EXIT_ENTRY_FAILED


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m ptxgym.single_call JOB.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(run_job(sys.argv[1]))
