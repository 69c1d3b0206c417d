"""The shared judge server on the CPU, with a stand-in judge: several processes, one judge.

The server runs in a thread of the test process (``serve`` with a stand-in factory); clients
connect through the same path as ``LocalGPUEvaluator(shared=True)`` does.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ptxgym import paths
from ptxgym.evaluate import judge_server
from ptxgym.evaluate.errors import EvaluatorError
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.local_gpu import _JudgeHandle
from ptxgym.evaluate.verdict import Verdict
from ptxgym.outcome import Status
from ptxgym.tasks import Task, get_task

SETTINGS = JudgeSettings(concurrency=4, stage_timeout_s=11.0)
GEMM = get_task("PTX-H100-GEMM")


class CountingJudge:
    """Counts the requests it serves, from whichever connection they come."""

    def __init__(self, device: int, settings: JudgeSettings) -> None:
        self.device_info = {"name": "counting stand-in"}
        self.served = 0
        self.lock = threading.Lock()

    def evaluate(self, task: Task, library: str, language: str = "cuda") -> Verdict:
        with self.lock:
            self.served += 1
        return Verdict(Status.PASSED, f"{task.id}:{library}")

    def baseline_ms(self, task: Task) -> dict[str, float]:
        return {task.id: float(self.served)}

    def close(self) -> None:
        pass


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[judge_server.ServerFiles]:
    monkeypatch.setenv("PTXGYM_CACHE", str(tmp_path))
    files = judge_server.server_files(0, SETTINGS)
    files.socket.parent.mkdir(parents=True)
    key = judge_server._key(files.key)
    thread = threading.Thread(
        target=judge_server.serve,
        args=(files.socket, key, SETTINGS, 1.0, CountingJudge),
        daemon=True,
    )
    thread.start()
    deadline = time.monotonic() + 10
    while not files.socket.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    yield files
    thread.join(timeout=15)
    assert not thread.is_alive(), "the server did not stop once idle"
    assert not files.socket.exists()


def _client_in_another_process(cache: str, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    import os

    os.environ["PTXGYM_CACHE"] = cache
    handle = _JudgeHandle.shared(0, SETTINGS)
    results.put(handle.evaluate(GEMM, "from-child").result().message)
    handle.close()


def test_processes_share_one_judge(server: judge_server.ServerFiles, tmp_path: Path) -> None:
    first = _JudgeHandle.shared(0, SETTINGS)
    second = _JudgeHandle.shared(0, SETTINGS)
    assert first.info == {"name": "counting stand-in"}
    verdict = first.evaluate(GEMM, "a").result()
    assert verdict.message == f"{GEMM.id}:a"
    # Its seconds waiting for one of the judge's threads, and in the judge.
    assert set(verdict.stage_seconds) == {"queued", "judged"}
    assert verdict.stage_seconds["queued"] >= 0.0
    assert second.evaluate(GEMM, "b").result().message == f"{GEMM.id}:b"
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=_client_in_another_process, args=(str(tmp_path), results))
    child.start()
    assert results.get(timeout=60) == f"{GEMM.id}:from-child"
    child.join(timeout=30)
    # One judge served all three: the two handles here and the other process.
    assert first.baseline(GEMM).result() == {GEMM.id: 3.0}
    first.close()
    second.close()


def test_the_socket_is_published_only_once_it_listens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that sees the socket's file can connect: the server binds under another name and
    renames once listening (a socket bound at the published path refuses connections between bind
    and listen, and a client that took that for a dead server would start a second one)."""
    monkeypatch.setenv("PTXGYM_CACHE", str(tmp_path))
    files = judge_server.server_files(0, SETTINGS)
    files.socket.parent.mkdir(parents=True)
    published_at_bind: list[bool] = []

    class WatchedListener(judge_server.Listener):  # type: ignore[misc, name-defined]
        def __init__(self, address: str, family: str) -> None:
            super().__init__(address, family)
            published_at_bind.append(files.socket.exists())

    monkeypatch.setattr(judge_server, "Listener", WatchedListener)
    key = judge_server._key(files.key)
    thread = threading.Thread(
        target=judge_server.serve,
        args=(files.socket, key, SETTINGS, 1.0, CountingJudge),
        daemon=True,
    )
    thread.start()
    deadline = time.monotonic() + 10
    while not files.socket.exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    conn = judge_server._try_connect(files.socket, key)  # at once: no retry, no refusal
    assert conn is not None
    conn.close()
    assert published_at_bind == [False]
    thread.join(timeout=15)
    assert not thread.is_alive() and not files.socket.exists()
    assert list(files.socket.parent.glob("*.sock*")) == []  # the bound name is gone too


def test_a_wrong_key_is_refused(server: judge_server.ServerFiles) -> None:
    assert judge_server._try_connect(server.socket, b"not the key") is None


def test_a_server_that_cannot_start_is_an_evaluator_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No GPU here: the real judge fails in its constructor, and the server process exits.
    monkeypatch.setenv("PTXGYM_CACHE", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(EvaluatorError, match="the shared judge exited with code"):
        _JudgeHandle.shared(0, JudgeSettings(concurrency=1))


def test_each_task_folder_has_its_own_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """A judge evaluates only its own tasks (``judge_messages.Request``): processes that load
    their tasks from another folder (``PTXGYM_DATA``) get a server of their own."""
    here = judge_server.server_files(0, SETTINGS)
    monkeypatch.setattr(paths, "envs_dir", lambda: Path("/elsewhere/envs"))
    assert judge_server.server_files(0, SETTINGS).socket != here.socket
