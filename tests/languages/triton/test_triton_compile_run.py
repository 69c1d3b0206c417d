"""The compile run's judge side, without a GPU (``ptxgym.evaluate.compile_run``): how a failed
run becomes a verdict, and what of an error is shown. How the language reaches the judge is
``tests/evaluate/test_judge_messages.py``'s."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ptxgym import paths
from ptxgym.evaluate.compile_run import (
    EXIT_COMPILE_ERROR,
    EXIT_RUNTIME_ERROR,
    RESULT_FILE,
    _failure,
    _message,
    prepare,
)
from ptxgym.evaluate.count import CountsRefused, _loaded_modules
from ptxgym.languages.triton.runtime import elf_interpreter
from ptxgym.outcome import Status
from ptxgym.sandbox import landlock
from ptxgym.tasks import get_task

GEMM = get_task("PTX-H100-GEMM")


def test_a_cuda_library_is_used_as_it_is(tmp_path: Path) -> None:
    prepared = prepare(
        GEMM, "/builds/x/candidate.so", "cuda", device=0, folder=tmp_path, timeout_s=1
    )
    assert (prepared.library, prepared.entry, prepared.failure) == (
        "/builds/x/candidate.so",
        "c-abi",
        None,
    )
    assert list(tmp_path.iterdir()) == []  # nothing ran


@pytest.mark.parametrize(
    ("code", "result", "status", "words"),
    [
        (None, None, Status.TIMEOUT, "took more than 30 s"),
        (
            EXIT_COMPILE_ERROR,
            "CompilationError: at 3:4: bad",
            Status.COMPILE_ERROR,
            "did not compile",
        ),
        (EXIT_RUNTIME_ERROR, "ValueError: no", Status.RUNTIME_ERROR, "the entry failed"),
        (-9, None, Status.RUNTIME_ERROR, "killed by signal 9"),
        (1, None, Status.RUNTIME_ERROR, "exited with code 1"),
    ],
)
def test_a_failed_run_is_a_verdict(
    tmp_path: Path, code: int | None, result: str | None, status: Status, words: str
) -> None:
    if result is not None:
        (tmp_path / RESULT_FILE).write_text(json.dumps({"message": result}))
    found, message = _failure(code, f"Traceback in {tmp_path}/candidate.py", tmp_path, 30.0)
    assert found is status and words in message
    assert str(tmp_path) not in message


def test_an_error_is_shown_without_host_paths(tmp_path: Path) -> None:
    error = RuntimeError(
        f"ptxas failed\nRepro command: /opt/triton/bin/ptxas {tmp_path}/x.ptx\n"
        f"at {tmp_path}/candidate.py:3"
    )
    shown = _message(error, tmp_path)
    assert "Repro command" not in shown and str(tmp_path) not in shown
    assert shown.startswith("RuntimeError: ptxas failed") and "candidate.py:3" in shown


def test_the_loaded_kernels_list_is_checked() -> None:
    assert _loaded_modules('["A/k.cubin", "B/k.cubin"]') == {"A/k.cubin", "B/k.cubin"}
    assert _loaded_modules("") == set()
    for bad in ('{"a": 1}', "[1, 2]"):
        with pytest.raises(CountsRefused):
            _loaded_modules(bad)


@pytest.mark.skipif(landlock.abi_version() < 1, reason="needs Landlock")
def test_only_the_listed_programs_may_start(tmp_path: Path) -> None:
    """The compile run's execute allow-list (``landlock.confine(executable=...)``): a listed
    program and its loader start, an unlisted one does not, though both may be read."""
    allowed = Path(shutil.which("true") or "/bin/true").resolve()
    loader = elf_interpreter(allowed)
    child = (
        "import subprocess, sys\n"
        "from pathlib import Path\n"
        "from ptxgym.sandbox import landlock\n"
        f"landlock.confine(writable=[Path({str(tmp_path)!r})],"
        f" readable=[Path(p) for p in landlock.SYSTEM_PROGRAMS + landlock.LOADER_FILES]"
        f" + [Path(p) for p in sys.path if p],"
        f" executable=[Path({str(allowed)!r}), Path({str(loader)!r})])\n"
        f"print(subprocess.run([{str(allowed)!r}]).returncode)\n"
        "try:\n"
        "    subprocess.run(['/bin/sh', '-c', 'true'])\n"
        "except PermissionError:\n"
        "    print('refused')\n"
        "print(len(Path('/bin/sh').resolve().read_bytes()) > 0)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", child],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(paths.import_root())},
        check=False,
    )
    assert result.stdout.split() == ["0", "refused", "True"], result.stderr[-2000:]
