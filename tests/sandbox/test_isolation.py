"""Least privilege for candidate processes, on the CPU: the scrubbed environment and confine()."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ptxgym.sandbox import seccomp
from ptxgym.sandbox.isolation import MAX_FILE_BYTES, scrubbed_environment, seal


def test_only_what_cuda_and_python_need_is_kept(tmp_path: Path) -> None:
    base = {
        "PATH": "/usr/bin",
        "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
        "CUDA_VISIBLE_DEVICES": "3",
        "NVIDIA_DRIVER_CAPABILITIES": "compute",
        "PYTHONPATH": "/site",
        "HOME": "/root",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "HF_TOKEN": "secret",
        "PTXGYM_CACHE": "/root/.cache/ptxgym",
        "SSH_AUTH_SOCK": "/tmp/agent",
        "OMP_NUM_THREADS": "16",
    }
    environment = scrubbed_environment(tmp_path, base)
    assert environment == {
        "PATH": "/usr/bin",
        "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
        "CUDA_VISIBLE_DEVICES": "3",
        "NVIDIA_DRIVER_CAPABILITIES": "compute",
        "PYTHONPATH": "/site",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp_path),
    }


def _probe(code: str, *arguments: str | Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``code`` in a fresh Python with ``arguments``; the JSON object it prints."""
    result = subprocess.run(
        [sys.executable, "-c", code, *map(str, arguments)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    facts: dict[str, Any] = json.loads(result.stdout)
    return facts


_PROBE = """
import ctypes, json, os, resource, sys, threading
from pathlib import Path
from ptxgym.sandbox.isolation import confine
facts = confine(Path(sys.argv[1]))
def writes(path):
    try:
        Path(path).write_text("x")
        return True
    except PermissionError:
        return False
print(json.dumps({
    "writes_inside": writes(Path(sys.argv[1]) / "inside"),
    "writes_outside": writes(sys.argv[2]),
    # What the CUDA driver does at start-up (naming its threads), and what must stay closed.
    "names_own_thread": writes(f"/proc/self/task/{threading.get_native_id()}/comm"),
    "names_parent": writes(f"/proc/{os.getppid()}/comm"),
    "facts": facts,
    "cwd": os.getcwd(),
    "secret": os.environ.get("PTXGYM_TEST_SECRET"),
    "proc_environ": "hunter2" in Path("/proc/self/environ").read_bytes().decode("latin-1"),
    "c_getenv": ctypes.CDLL(None).getenv(b"PTXGYM_TEST_SECRET"),
    "home": os.environ["HOME"],
    "fsize": resource.getrlimit(resource.RLIMIT_FSIZE)[0],
    "core": resource.getrlimit(resource.RLIMIT_CORE)[0],
}))
"""


def test_confine_scrubs_moves_and_limits_the_process(tmp_path: Path) -> None:
    folder = tmp_path / "worker"
    facts = _probe(
        _PROBE, folder, tmp_path / "outside", env={**os.environ, "PTXGYM_TEST_SECRET": "hunter2"}
    )
    assert facts["cwd"] == str(folder) and facts["home"] == str(folder)
    assert facts["secret"] is None
    assert facts["proc_environ"] is False  # the block the process started with is zeroed
    assert facts["c_getenv"] == 0  # gone from the C library's environment too (NULL)
    assert facts["fsize"] == MAX_FILE_BYTES and facts["core"] == 0
    assert isinstance(facts["facts"]["network_isolated"], bool)
    # Landlock (this CI kernel has it): writes only beneath the process's own folder.
    assert facts["facts"]["writes_confined"] is True
    assert facts["writes_inside"] is True and facts["writes_outside"] is False
    assert not (tmp_path / "outside").exists()
    assert facts["names_own_thread"] is True and facts["names_parent"] is False


_SEAL_PROBE = """
import errno, json, os, socket, subprocess, sys, threading
from ptxgym.sandbox.isolation import seal

# A thread started before the filter, as the CUDA driver's are: it must be filtered too (TSYNC).
go, done, results = threading.Event(), threading.Event(), {}
def attempt(name, call):
    try:
        call()
        results[name] = "allowed"
    except OSError as exc:
        results[name] = errno.errorcode.get(exc.errno, str(exc.errno))
def early_thread():
    go.wait()
    attempt("fork_from_early_thread", lambda: os._exit(0) if os.fork() == 0 else None)
    done.set()
threading.Thread(target=early_thread).start()

results["sealed"] = seal(network=sys.argv[1] == "network")
go.set()
done.wait()
attempt("fork", lambda: os._exit(0) if os.fork() == 0 else None)
attempt("execute", lambda: subprocess.run(["true"], check=False))
attempt("signal_parent", lambda: os.kill(os.getppid(), 0))
attempt("signal_self", lambda: os.kill(os.getpid(), 0))
attempt("inet_socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close())
attempt("unix_socket", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close())
attempt("new_thread", lambda: threading.Thread(target=lambda: None).start())
print(json.dumps(results))
"""


def _sealed(network: str) -> dict[str, Any]:
    return _probe(_SEAL_PROBE, network)


def test_the_seccomp_filter_stops_processes_signals_and_sockets_on_every_thread() -> None:
    facts = _sealed("no-network")
    assert facts["sealed"] is True, "this host has no libseccomp or refuses filters"
    assert facts["fork"] == facts["fork_from_early_thread"] == facts["execute"] == "EPERM"
    assert facts["signal_parent"] == facts["inet_socket"] == "EPERM"
    # What CUDA, torch and the judge's channel need still works.
    assert facts["signal_self"] == facts["unix_socket"] == facts["new_thread"] == "allowed"


def test_the_tool_runs_filter_keeps_sockets_for_the_tools() -> None:
    facts = _sealed("network")
    assert facts["sealed"] is True
    assert facts["inet_socket"] == "allowed"
    assert facts["fork"] == facts["signal_parent"] == "EPERM"


def test_without_libseccomp_the_worker_says_so_and_goes_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def missing() -> None:
        raise seccomp.SeccompUnavailable("libseccomp is not installed (test)")

    monkeypatch.setattr(seccomp, "_library", missing)
    assert seal(network=False) is False  # reported in outcome.isolation, not silently ignored
    assert "no seccomp filter: libseccomp is not installed" in capsys.readouterr().err


_RAW_WRITE = r"""
/* open(path, O_WRONLY|O_CREAT|O_TRUNC) as a raw system call, the instruction written as bytes:
   the technique of tests/hostile/raw_syscall_file_write.cu, which only the kernel can stop. */
long raw_open(const char* path) {
  long result;
  asm volatile(".byte 0x0f, 0x05" : "=a"(result) : "a"(2L), "D"(path), "S"(0x241L), "d"(0600L)
               : "rcx", "r11", "memory");
  return result;
}
"""

_RAW_PROBE = """
import ctypes, json, sys
from pathlib import Path
from ptxgym.sandbox.isolation import confine
library = ctypes.CDLL(sys.argv[1])
library.raw_open.restype = ctypes.c_long
confine(Path(sys.argv[2]))
print(json.dumps({"inside": library.raw_open(sys.argv[3].encode()),
                  "outside": library.raw_open(sys.argv[4].encode())}))
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64 system call numbers")
def test_a_raw_system_call_cannot_write_outside_the_folder(tmp_path: Path) -> None:
    source = tmp_path / "raw.c"
    source.write_text(_RAW_WRITE)
    library = tmp_path / "libraw.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", library, source], check=True)
    folder, outside = tmp_path / "worker", tmp_path / "outside"
    opened = _probe(_RAW_PROBE, library, folder, folder / "inside", outside)
    assert opened["inside"] >= 0  # a file descriptor
    assert opened["outside"] == -13  # -EACCES: Landlock
    assert not outside.exists()


_LOCK_PROBE = """
import sys
from pathlib import Path
from ptxgym.device.lock import holding
from ptxgym.sandbox.isolation import confine
lock = Path(sys.argv[2])
with holding(lock):  # made before, as the judge makes it before it starts a worker
    pass
confine(Path(sys.argv[1]))
with holding(lock, exclusive=False):  # a worker's start-up, confined before CUDA starts
    pass
with holding(lock):  # the single-call run's call
    pass
print("locked")
"""


def test_a_confined_process_still_takes_the_gpu_lock(tmp_path: Path) -> None:
    # The lock lives in the locks' folder, outside the process's own, where it may no longer
    # write but may still read (Landlock).
    result = subprocess.run(
        [sys.executable, "-c", _LOCK_PROBE, tmp_path / "worker", tmp_path / "locks" / "gpu.lock"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PTXGYM_LOCK_DIR": str(tmp_path / "locks")},
    )
    assert result.returncode == 0 and result.stdout.strip() == "locked", result.stderr
