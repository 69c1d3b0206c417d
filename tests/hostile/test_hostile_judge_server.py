"""Hostile peers of a judge: pickles, malformed JSON, wrong types, huge messages, bad handshakes.

The judge is trusted and unconfined (it holds the GPU, the references and the baselines). A process
that got the shared server's key (say, a candidate that read ptxgym's cache folder), or that writes
on a private judge's pipe, must not run code in it, nor keep it from serving the next client; and a
judge's answers must not run code in its clients either. Every attack here sends what it sends after
a correct key, so only the message protocol (``ptxgym.evaluate.judge_messages``) stands in the way.
A pickle's proof is a canary: unpickling ``_Canary`` creates a file.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Client, Connection, Pipe, answer_challenge
from pathlib import Path
from typing import Any

import pytest

from ptxgym.evaluate import judge_messages, judge_server
from ptxgym.evaluate import local_gpu as gpu_evaluator
from ptxgym.evaluate.errors import EvaluatorError
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.evaluate.local_gpu import _JudgeHandle
from ptxgym.evaluate.verdict import Verdict
from ptxgym.evaluate.verdict_json import verdict_to_json
from ptxgym.outcome import Status
from ptxgym.tasks import Task, get_task

SETTINGS = JudgeSettings(concurrency=2, stage_timeout_s=13.0)
# How long the test server waits without a connection before it stops (teardown waits for that).
IDLE_S = 1.0
GEMM = get_task("PTX-H100-GEMM")
GEMM_JSON = GEMM.model_dump(mode="json")


class _Canary:
    """Unpickling it opens ``path`` for writing, which creates the file: a reader that
    unpickled what it was sent leaves the file behind."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


class RecordingJudge:
    """A stand-in judge (no GPU) that records what it is asked."""

    def __init__(self) -> None:
        self.device_info = {"name": "recording stand-in"}
        self.asked: list[tuple[str, str]] = []

    def evaluate(self, task: Task, library: str, language: str = "cuda") -> Verdict:
        self.asked.append((task.id, library))
        return Verdict(Status.PASSED, f"{task.id}:{library}")

    def baseline_ms(self, task: Task) -> dict[str, float]:
        self.asked.append((task.id, "baseline"))
        return {w.name: 1.0 for w in task.workloads}

    def close(self) -> None:
        pass


def _next_frame(conn: Connection, timeout_s: float = 30.0) -> bytes | None:
    """The next frame the other side sends, or None once it has closed the connection (a reset:
    it closed with some of what we sent unread)."""
    assert conn.poll(timeout_s), "no answer, and the connection was not closed either"
    try:
        return conn.recv_bytes()
    except (EOFError, ConnectionResetError):
        return None


def _answer(conn: Connection) -> list[Any] | None:
    frame = _next_frame(conn)
    return None if frame is None else json.loads(frame)


@pytest.fixture
def judge() -> RecordingJudge:
    return RecordingJudge()


@pytest.fixture
def server(
    judge: RecordingJudge,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[judge_server.ServerFiles, bytes]]:
    """A shared judge server (``serve``) in a thread, around ``judge``; its files and key."""
    monkeypatch.setenv("PTXGYM_CACHE", str(tmp_path_factory.mktemp("judge")))
    files = judge_server.server_files(0, SETTINGS)
    files.socket.parent.mkdir(parents=True)
    key = judge_server._key(files.key)
    thread = threading.Thread(
        target=judge_server.serve,
        args=(files.socket, key, SETTINGS, IDLE_S, lambda device, settings: judge),
        daemon=True,
    )
    thread.start()
    deadline = time.monotonic() + 10
    while not files.socket.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    # A connection held open for the whole test: the server stops after IDLE_S without one, which
    # a loaded machine can take between this fixture and the test's first connection.
    keeper = _key_holder((files, key))
    yield files, key
    keeper.close()
    thread.join(timeout=15)
    assert not thread.is_alive(), "the server did not stop once idle"


def _key_holder(server: tuple[judge_server.ServerFiles, bytes]) -> Connection:
    """A client that knows the key, past the handshake and the server's first frame."""
    files, key = server
    conn = Client(str(files.socket), family="AF_UNIX", authkey=key)
    assert _next_frame(conn) is not None  # "ready"
    return conn


def _a_good_client_is_served(judge: RecordingJudge) -> None:
    """The server still serves: a client connected the usual way gets its verdict."""
    handle = _JudgeHandle.shared(0, SETTINGS)
    try:
        assert handle.evaluate(GEMM, "good").result(timeout=30).message == f"{GEMM.id}:good"
    finally:
        handle.close()
    assert judge.asked == [(GEMM.id, "good")]


def test_a_key_holders_pickle_never_runs_in_the_shared_judge(
    server: tuple[judge_server.ServerFiles, bytes], judge: RecordingJudge, tmp_path: Path
) -> None:
    canary = tmp_path / "canary"
    conn = _key_holder(server)
    conn.send_bytes(pickle.dumps(_Canary(canary)))
    answered = conn.poll(30)
    assert not canary.exists(), "the judge unpickled what a client sent"
    answer = _next_frame(conn) if answered else None
    assert answer is not None
    request_id, kind, reason = json.loads(answer)
    assert (request_id, kind) == (None, "failed") and "not a JSON message" in reason
    assert _next_frame(conn) is None, "the judge kept talking to a client that sent garbage"
    conn.close()
    _a_good_client_is_served(judge)


def _evaluate(
    request_id: object = 7, deadline: object = None, task: object = None, library: object = "x"
) -> list[object]:
    """An evaluate request, well formed unless a part is given."""
    return ["evaluate", request_id, deadline, GEMM_JSON if task is None else task, library]


def _task_with(**changes: Any) -> dict[str, Any]:
    task: dict[str, Any] = json.loads(json.dumps(GEMM_JSON))
    task.update(changes)
    return task


# (what is sent, the id the refusal names (None: the connection is then closed), its reason)
MALFORMED = {
    "not-json": (b"{'evaluate': 1", None, "not a JSON message"),
    "not-utf8": (b'["evaluate", 7, null, "\xff"]', None, "not a JSON message"),
    "nested-too-deep": (b"[" * 100_000, None, "not a JSON message"),
    "not-a-list": (b'{"kind": "evaluate"}', None, "non-empty JSON list"),
    "empty-list": (b"[]", None, "non-empty JSON list"),
    "no-id": (b'["evaluate"]', None, "no request id"),
    "id-a-string": (json.dumps(_evaluate(request_id="7")).encode(), None, "no request id"),
    "id-a-boolean": (json.dumps(_evaluate(request_id=True)).encode(), None, "no request id"),
    "id-negative": (json.dumps(_evaluate(request_id=-1)).encode(), None, "no request id"),
    "unknown-kind": (b'["exec", 7, null, "import os"]', 7, "unknown request"),
    "kind-a-list": (b'[["evaluate"], 7, null]', 7, "unknown request"),
    "too-few-arguments": (json.dumps(_evaluate()[:4]).encode(), 7, "wrong number of arguments"),
    "too-many-arguments": (
        json.dumps([*_evaluate(), "cuda", "more"]).encode(),  # library, language, and more
        7,
        "wrong number of arguments",
    ),
    "deadline-a-string": (json.dumps(_evaluate(deadline="soon")).encode(), 7, "deadline"),
    "deadline-nan": (b'["baseline", 7, NaN, {}]', 7, "deadline"),
    "task-an-id": (json.dumps(_evaluate(task=GEMM.id)).encode(), 7, "has no task"),
    "task-unknown": (
        json.dumps(_evaluate(task=_task_with(id="PTX-H100-Nope"))).encode(),
        7,
        "has no task",
    ),
    "task-other-callables": (
        json.dumps(
            _evaluate(
                task=_task_with(
                    callables={
                        "inputs": "subprocess:run",
                        "reference": "os:system",
                        "baseline": "pickle:loads",
                        "params": {},
                    }
                )
            )
        ).encode(),
        7,
        "differs from the judge's task",
    ),
    "library-a-number": (json.dumps(_evaluate(library=42)).encode(), 7, "library must be a path"),
    "library-empty": (json.dumps(_evaluate(library="")).encode(), 7, "library must be a path"),
    "library-with-nul": (json.dumps(_evaluate(library="a\0b")).encode(), 7, "NUL"),
}


@pytest.mark.parametrize(("message", "request_id", "reason"), MALFORMED.values(), ids=MALFORMED)
def test_a_malformed_request_is_refused_and_the_server_goes_on(
    server: tuple[judge_server.ServerFiles, bytes],
    judge: RecordingJudge,
    message: bytes,
    request_id: int | None,
    reason: str,
) -> None:
    conn = _key_holder(server)
    conn.send_bytes(message)
    answer = _answer(conn)
    assert answer is not None and answer[:2] == [request_id, "failed"], answer
    assert reason in answer[2]
    if request_id is None:
        assert _next_frame(conn) is None, "the judge kept talking to a client that sent garbage"
    else:  # a refused request costs only itself: the same connection is still served
        conn.send_bytes(json.dumps(["baseline", 8, None, GEMM_JSON]).encode())
        assert _answer(conn) == [8, "baseline", {w.name: 1.0 for w in GEMM.workloads}]
        judge.asked.clear()
    conn.close()
    _a_good_client_is_served(judge)


def test_a_huge_message_is_not_read_and_the_server_goes_on(
    server: tuple[judge_server.ServerFiles, bytes], judge: RecordingJudge
) -> None:
    conn = _key_holder(server)
    # The judge answers once it has read the frame's length, and closes on the rest.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        conn.send_bytes(b" " * (judge_messages.MAX_REQUEST_BYTES + 1))
    answer = _answer(conn)
    assert answer is not None and answer[:2] == [None, "failed"] and "over" in answer[2]
    assert _next_frame(conn) is None
    conn.close()
    _a_good_client_is_served(judge)


def test_a_client_that_stalls_in_the_handshake_holds_up_nobody(
    server: tuple[judge_server.ServerFiles, bytes],
    judge: RecordingJudge,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(judge_server, "HANDSHAKE_TIMEOUT_S", 1.0)
    files, _ = server
    silent = Client(str(files.socket), family="AF_UNIX")  # connected, never answers
    # In a thread: were the server stuck on the silent client, the good one would wait forever.
    served = threading.Thread(target=_a_good_client_is_served, args=(judge,), daemon=True)
    served.start()
    served.join(timeout=30)
    assert not served.is_alive(), "a client that stalled in the handshake held up the next one"
    assert judge.asked == [(GEMM.id, "good")]
    # And the silent one is dropped once the handshake's time is up.
    assert _next_frame(silent) is not None  # the challenge
    assert _next_frame(silent, timeout_s=10) is None
    silent.close()


def test_a_key_holder_that_garbles_the_handshake_does_not_stop_the_server(
    server: tuple[judge_server.ServerFiles, bytes], judge: RecordingJudge
) -> None:
    files, key = server
    conn = Client(str(files.socket), family="AF_UNIX")
    answer_challenge(conn, key)  # passes the server's challenge with the right key ...
    conn.send_bytes(b"garbage instead of a challenge")  # ... then sends garbage for its own
    assert _next_frame(conn, timeout_s=10) is None
    conn.close()
    _a_good_client_is_served(judge)


# ---------------------------------------------------------------------------------------------
# The private judge's pipe (``judge_main``), served by a thread here instead of a process.


@pytest.fixture
def private_judge(judge: RecordingJudge) -> Iterator[tuple[Connection, threading.Thread]]:
    """``judge_main`` around ``judge`` on a pipe; the evaluator's end, past "ready"."""
    conn, child = Pipe()
    thread = threading.Thread(
        target=judge_server.judge_main,
        args=(child, 0, SETTINGS, lambda device, settings: judge),
        daemon=True,
    )
    thread.start()
    assert _next_frame(conn) is not None  # "ready"
    yield conn, thread
    conn.close()
    thread.join(timeout=15)
    assert not thread.is_alive()


def test_a_pickle_on_the_private_pipe_never_runs_in_the_judge(
    private_judge: tuple[Connection, threading.Thread], judge: RecordingJudge, tmp_path: Path
) -> None:
    conn, thread = private_judge
    canary = tmp_path / "canary"
    conn.send_bytes(pickle.dumps(_Canary(canary)))
    answered = conn.poll(30)
    assert not canary.exists(), "the judge unpickled what came over its pipe"
    answer = _next_frame(conn) if answered else None
    assert answer is not None and json.loads(answer)[:2] == [None, "failed"]
    assert _next_frame(conn) is None  # the judge ends: its only client is broken
    thread.join(timeout=15)
    assert not thread.is_alive() and judge.asked == []


@pytest.mark.parametrize(
    ("message", "request_id", "reason"),
    [MALFORMED[name] for name in ("task-other-callables", "library-a-number", "unknown-kind")],
)
def test_a_malformed_request_on_the_private_pipe_fails_alone(
    private_judge: tuple[Connection, threading.Thread],
    judge: RecordingJudge,
    message: bytes,
    request_id: int,
    reason: str,
) -> None:
    conn, _ = private_judge
    conn.send_bytes(message)
    answer = _answer(conn)
    assert answer is not None and answer[:2] == [request_id, "failed"] and reason in answer[2]
    conn.send_bytes(json.dumps(_evaluate(request_id=9, library="good")).encode())
    answer = _answer(conn)
    assert answer is not None and answer[:2] == [9, "verdict"]
    assert answer[2]["message"] == f"{GEMM.id}:good"
    assert judge.asked == [(GEMM.id, "good")]


# ---------------------------------------------------------------------------------------------
# The other direction: what a judge answers, read by the evaluator's handle.


@pytest.fixture
def fake_judge() -> Iterator[tuple[_JudgeHandle, Connection]]:
    """A handle whose judge is the test: the test reads the requests and writes the answers."""
    conn, judge_end = Pipe()
    handle = _JudgeHandle(conn, {"name": "fake"}, 0)
    yield handle, judge_end
    handle.close()
    judge_end.close()


def test_a_pickled_answer_never_runs_in_the_client(
    fake_judge: tuple[_JudgeHandle, Connection], tmp_path: Path
) -> None:
    handle, judge_end = fake_judge
    canary = tmp_path / "canary"
    pending = handle.evaluate(GEMM, "lib")
    assert _answer(judge_end) == ["evaluate", 0, None, GEMM_JSON, "lib"]
    judge_end.send_bytes(pickle.dumps(_Canary(canary)))
    with pytest.raises(EvaluatorError, match="not an answer"):
        pending.result(timeout=30)
    assert not canary.exists(), "the client unpickled the judge's answer"
    with pytest.raises(EvaluatorError, match="is gone"):
        handle.baseline(GEMM).result(timeout=30)


def test_a_malformed_answer_fails_its_request_alone(
    fake_judge: tuple[_JudgeHandle, Connection],
) -> None:
    handle, judge_end = fake_judge
    malformed, wrong_kind, good = (handle.evaluate(GEMM, name) for name in ("a", "b", "c"))
    ids = [_answer(judge_end)[1] for _ in range(3)]  # type: ignore[index]
    verdict = verdict_to_json(Verdict(Status.PASSED, "fine"))
    judge_end.send_bytes(json.dumps([ids[0], "verdict", {**verdict, "seconds": "1"}]).encode())
    judge_end.send_bytes(json.dumps([ids[1], "baseline", {"w": 1.0}]).encode())
    judge_end.send_bytes(json.dumps([ids[2], "verdict", verdict]).encode())
    with pytest.raises(EvaluatorError, match=r"malformed.*verdict\.seconds: expected a number"):
        malformed.result(timeout=30)
    with pytest.raises(EvaluatorError, match="answered 'baseline', not 'verdict'"):
        wrong_kind.result(timeout=30)
    assert good.result(timeout=30) == Verdict(Status.PASSED, "fine")
    assert handle.alive


def test_a_huge_answer_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_evaluator, "MAX_ANSWER_BYTES", 1000)  # before the reader starts
    conn, judge_end = Pipe()
    handle = _JudgeHandle(conn, {"name": "fake"}, 0)
    pending = handle.evaluate(GEMM, "lib")
    request_id = _answer(judge_end)[1]  # type: ignore[index]
    judge_end.send_bytes(json.dumps([request_id, "failed", "x" * 1000]).encode())
    with pytest.raises(EvaluatorError, match="over 1000 bytes"):
        pending.result(timeout=30)
    handle.close()
    judge_end.close()
