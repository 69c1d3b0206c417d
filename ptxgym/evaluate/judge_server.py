"""Serving a judge: to the one process that started it, or to every process of the user.

``judge_main`` is the process entry of a judge private to one evaluator process (its requests
come over a pipe). ``serve_connection`` answers the requests of one connection; both it and the
shared server use it. What crosses a connection, and how each message is checked, is
``judge_messages``'s: JSON, never pickles.

The shared judge: one server per GPU, settings and task folder, on a Unix socket.

Envs in different processes (``AsyncVectorEnv`` workers, separate training processes) that ask
for a shared judge (``LocalGPUEvaluator(shared=True)``) all talk to the same judge process. It
keeps one copy of each workload's references and inputs seeds, one baseline measurement, one pool
of spare workers, and it overlaps their requests as a judge does for threads. The first process
that needs the server starts it, detached (it outlives that process); it stops by itself once no
process has been connected for ``IDLE_S`` seconds.

The socket and its key live in ptxgym's cache folder, readable by the user only. Connections
authenticate with the key (``multiprocessing.connection``'s HMAC challenge, which exchanges only
raw bytes), each in its own thread and within ``HANDSHAKE_TIMEOUT_S``, so a peer that stalls or
misbehaves there holds up nobody else.

A request whose arguments are wrong is answered ``failed`` and the connection goes on; a message
that is not a request at all (not JSON, no id, too large) is answered ``failed`` with a null id
and the connection is closed. Nothing a client sends stops the server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import importlib
import json
import os
import secrets
import socket as sockets
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import AuthenticationError
from multiprocessing.connection import (
    Client,
    Connection,
    Listener,
    answer_challenge,
    deliver_challenge,
)
from pathlib import Path
from typing import Any

from ptxgym import paths
from ptxgym.device.gpus import physical_device
from ptxgym.evaluate.judge import Judge
from ptxgym.evaluate.judge_messages import (
    MAX_ANSWER_BYTES,
    MAX_REQUEST_BYTES,
    MessageError,
    Request,
    answer_message,
    read_answer,
    receive_message,
    send_message,
)
from ptxgym.evaluate.judge_settings import JudgeSettings

IDLE_S = 120.0
_START_TIMEOUT_S = 600.0
# A client answers the key's challenge in milliseconds; one that has not within this many
# seconds (per read) is dropped.
HANDSHAKE_TIMEOUT_S = 10.0
# What a private judge's process makes (``module:name``) unless told otherwise (tests: a
# stand-in that needs no GPU).
DEFAULT_JUDGE = "ptxgym.evaluate.judge:Judge"


def start_private_judge(
    device: int, settings: JudgeSettings, factory: str = DEFAULT_JUDGE
) -> tuple[Connection, subprocess.Popen[bytes]]:
    """Start a judge private to this process: ``python -m ptxgym.evaluate.judge_server private``, a
    program of its own, talking over a socket pair. Not multiprocessing's ``spawn``, which runs
    the parent's main script again in the child: a user's script without an
    ``if __name__ == "__main__":`` guard (as RL scripts and the README's snippet are written)
    would then step an env inside the judge's start-up. The child sees the parent's module path,
    so ``factory`` (``module:name``) may name anything the parent can import."""
    ours, theirs = sockets.socketpair(sockets.AF_UNIX, sockets.SOCK_STREAM)
    module_path = os.pathsep.join(entry for entry in sys.path if entry)
    command = [
        sys.executable,
        "-m",
        "ptxgym.evaluate.judge_server",
        "private",
        str(theirs.fileno()),
        str(device),
        json.dumps(dataclasses.asdict(settings)),
        factory,
    ]
    try:
        process = subprocess.Popen(
            command,
            pass_fds=(theirs.fileno(),),
            env={**os.environ, "PYTHONPATH": module_path},
            stdin=subprocess.DEVNULL,
        )
    finally:
        theirs.close()
    return Connection(ours.detach()), process


def judge_main(
    conn: Connection,
    device: int,
    settings: JudgeSettings,
    factory: Callable[[int, JudgeSettings], Judge] = Judge,
) -> None:
    """Serve the requests of a judge private to one evaluator process on ``conn`` until it
    closes (``python -m ptxgym.evaluate.judge_server private``, started by ``start_private_judge``).

    ``factory`` makes the judge (tests give a stand-in that needs no GPU).
    """
    with contextlib.closing(conn):  # when the judge ends, its client hears so at once
        try:
            judge = factory(device, settings)
        except Exception as exc:
            send_message(conn, answer_message(None, "failed", f"{type(exc).__name__}: {exc}"))
            return
        send_message(conn, answer_message(None, "ready", judge.device_info))
        with ThreadPoolExecutor(max_workers=settings.concurrency) as pool:
            serve_connection(conn, judge, pool)
            pool.shutdown(wait=False, cancel_futures=True)
    judge.close()


def serve_connection(conn: Connection, judge: Judge, pool: ThreadPoolExecutor) -> None:
    """Answer the requests that arrive on ``conn`` until it closes, says ``close``, or sends
    something that is not a request.

    Each request (``judge_messages``) is served by ``pool`` (in the order received, as many at
    once as the pool has threads) and answered on ``conn`` with ``[request_id, kind, payload]``.
    A request still queued when its deadline (``time.time()`` seconds, or None) passes is
    answered ``expired`` and not served.
    """
    send_lock = threading.Lock()

    def answer(request_id: int | None, kind: str, payload: Any) -> None:
        try:
            data = json.dumps(answer_message(request_id, kind, payload)).encode()
        except Exception as exc:  # a judge's bug: say so rather than leave the asker waiting
            answer(request_id, "failed", f"the answer could not be written: {exc}")
            return
        if len(data) > MAX_ANSWER_BYTES:
            answer(request_id, "failed", f"the answer is over {MAX_ANSWER_BYTES} bytes")
            return
        try:
            with send_lock:
                conn.send_bytes(data)
        except (OSError, ValueError):
            pass  # the asker has gone; nobody is left to tell

    def serve(request: Request, received: float) -> None:
        if request.deadline is not None and time.time() > request.deadline:
            answer(
                request.request_id, "expired", "the request waited past its deadline in the queue"
            )
            return
        try:
            if request.library is not None:
                # How long it waited for one of the pool's threads: at full concurrency, the
                # judge's own queue.
                queued = time.perf_counter() - received
                verdict = judge.evaluate(request.task, request.library, request.language)
                stages = {**verdict.stage_seconds, "queued": queued, "judged": verdict.seconds}
                verdict = dataclasses.replace(verdict, stage_seconds=stages)
                answer(request.request_id, "verdict", verdict)
            else:
                answer(request.request_id, "baseline", judge.baseline_ms(request.task))
        except Exception as exc:  # an evaluator bug or a missing dependency: report, keep serving
            answer(request.request_id, "failed", f"{type(exc).__name__}: {exc}")

    while True:
        try:
            message = receive_message(conn, MAX_REQUEST_BYTES)
            if message == ["close"]:
                break
            request = Request.from_message(message)
        except (EOFError, OSError):
            break
        except MessageError as exc:
            answer(exc.request_id, "failed", f"refused: {exc}")
            if exc.request_id is None:
                break  # not a request at all: the client is broken or hostile
            continue
        pool.submit(serve, request, time.perf_counter())


@dataclasses.dataclass(frozen=True)
class ServerFiles:
    """Where the server of one (GPU, settings) listens, its key, its start lock and its log."""

    socket: Path
    key: Path
    lock: Path
    log: Path


def server_files(device: int, settings: JudgeSettings) -> ServerFiles:
    """The files of the server for CUDA device ``device`` of this process and ``settings``, and
    this process's task folder (the judge evaluates only its own tasks: ``judge_messages``)."""
    physical = physical_device(device).replace("/", "_")
    served = {"settings": dataclasses.asdict(settings), "tasks": str(paths.envs_dir())}
    digest = hashlib.sha256(json.dumps(served, sort_keys=True).encode()).hexdigest()[:12]
    # Unix socket paths are limited to about 100 bytes: a short name in a short folder.
    folder = paths.cache_dir() / "judges"
    stem = f"gpu{physical}-{digest}"
    return ServerFiles(
        folder / f"{stem}.sock",
        folder / f"{stem}.key",
        folder / f"{stem}.start-lock",
        folder / f"{stem}.log",
    )


def connect(device: int, settings: JudgeSettings) -> tuple[Connection, dict[str, Any]]:
    """A connection to the shared judge of ``device`` and ``settings``, and its device facts;
    the server is started first if none is running."""
    files = server_files(device, settings)
    files.socket.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    for _ in range(3):  # a server stopping just as we connect closes on us: start a new one
        descriptor = os.open(files.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)  # one starter at a time
            key = _key(files.key)
            conn = _try_connect(files.socket, key)
            if conn is None:
                files.socket.unlink(missing_ok=True)  # left by a server that died
                server = _start_server(files, device, settings)
                conn = _wait_for_server(files, key, server)
        finally:
            os.close(descriptor)
        try:
            _, kind, payload = read_answer(receive_message(conn, MAX_ANSWER_BYTES))
        except (EOFError, OSError):
            conn.close()
            continue
        except MessageError as exc:
            conn.close()
            raise RuntimeError(
                f"the shared judge's first answer is not of the protocol: {exc}"
            ) from None
        if kind != "ready":
            conn.close()
            raise RuntimeError(f"the shared judge failed to start: {payload}")
        return conn, payload
    raise RuntimeError(f"could not connect to the shared judge at {files.socket}")


def _key(path: Path) -> bytes:
    if not path.exists():
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(secrets.token_hex(32))
    return path.read_text().strip().encode()


def _try_connect(socket: Path, key: bytes) -> Connection | None:
    if not socket.exists():
        return None
    try:
        return Client(str(socket), family="AF_UNIX", authkey=key)
    except (OSError, EOFError, AuthenticationError):
        return None


def _start_server(
    files: ServerFiles, device: int, settings: JudgeSettings
) -> subprocess.Popen[bytes]:
    environment = {**os.environ, "CUDA_VISIBLE_DEVICES": physical_device(device)}
    with files.log.open("ab") as log:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ptxgym.evaluate.judge_server",
                str(files.socket),
                str(files.key),
                json.dumps(dataclasses.asdict(settings)),
            ],
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # detached: it outlives the process that started it
        )
    # It stops by itself once idle, maybe while this process lives on: reaped then, not left a
    # zombie for as long as this process runs.
    threading.Thread(target=server.wait, name="judge-server-reaper", daemon=True).start()
    return server


def _wait_for_server(files: ServerFiles, key: bytes, server: subprocess.Popen[bytes]) -> Connection:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        conn = _try_connect(files.socket, key)
        if conn is not None:
            return conn
        if server.poll() is not None:
            tail = files.log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the shared judge exited with code {server.returncode}:\n{tail}")
        time.sleep(0.1)
    raise RuntimeError(f"the shared judge did not start; its log is {files.log}")


def serve(
    socket: Path,
    key: bytes,
    settings: JudgeSettings,
    idle_s: float = IDLE_S,
    factory: Callable[[int, JudgeSettings], Judge] = Judge,
) -> None:
    """The server: one judge (device 0 of this process), any number of connections, until no
    connection has been open for ``idle_s``. ``factory`` makes the judge (tests: a stand-in)."""
    judge = factory(0, settings)
    # No authkey here: Listener.accept would run the key's challenge in the accepting thread,
    # where one client that stalls holds up every other. Each connection's thread runs it.
    # The socket's file appears at bind, a moment before listen, when a connection is refused.
    # Bound under another name and renamed once listening, it is at ``socket`` only when a client
    # can connect; and closing the listener then unlinks only that other name, never a socket that
    # a newer server has put at ``socket`` since this one left the file system.
    binding = socket.with_name(f"{socket.name}.{os.getpid()}")
    binding.unlink(missing_ok=True)  # left by a server of an earlier process with this pid
    listener = Listener(str(binding), family="AF_UNIX")
    os.chmod(binding, 0o600)
    os.rename(binding, socket)
    active = 0
    last_left = time.monotonic()
    stopping = threading.Event()
    mutex = threading.Lock()

    def watch_idle() -> None:
        while not stopping.is_set():
            time.sleep(min(5.0, idle_s / 4))
            with mutex:
                if active == 0 and time.monotonic() - last_left > idle_s:
                    # Gone from the file system first: a process that comes now starts a new
                    # server instead of connecting to this one as it stops.
                    with contextlib.suppress(OSError):
                        socket.unlink()
                    stopping.set()

    def handle(conn: Connection) -> None:
        nonlocal active, last_left
        try:
            try:
                _authenticate(conn, key)
                send_message(conn, answer_message(None, "ready", judge.device_info))
            except Exception:  # what the challenge raises differs between Python versions
                return  # a wrong key, a client that stalled or left, or one that sent garbage
            serve_connection(conn, judge, pool)
        finally:
            conn.close()
            with mutex:
                active -= 1
                last_left = time.monotonic()

    threading.Thread(target=watch_idle, daemon=True).start()
    # accept() wakes every second to see whether the server is stopping. Listener has no public
    # timeout; its listening socket is reached through a private attribute.
    listener._listener._socket.settimeout(1.0)  # type: ignore[attr-defined]
    with ThreadPoolExecutor(max_workers=settings.concurrency) as pool:
        while not stopping.is_set():
            try:
                conn = listener.accept()
            except OSError:
                continue  # the periodic wake-up
            with mutex:
                if stopping.is_set():
                    conn.close()
                    break
                active += 1
            threading.Thread(target=handle, args=(conn,), daemon=True).start()
    with contextlib.suppress(OSError):  # it unlinks the name it was bound to, gone since
        listener.close()
    judge.close()


def _authenticate(conn: Connection, key: bytes) -> None:
    """The key's challenge, both ways, as ``Listener(authkey=key).accept`` runs it
    (``multiprocessing.connection``: raw byte frames of at most 256 bytes and an HMAC, nothing
    unpickled), each read bounded by ``HANDSHAKE_TIMEOUT_S``; raises when it fails."""
    seconds, fraction = divmod(HANDSHAKE_TIMEOUT_S, 1.0)
    bounded = struct.pack("ll", int(seconds), int(fraction * 1e6))  # a struct timeval
    # A second descriptor of the same socket, only to set its option: closing it leaves conn's.
    with sockets.fromfd(conn.fileno(), sockets.AF_UNIX, sockets.SOCK_STREAM) as view:
        view.setsockopt(sockets.SOL_SOCKET, sockets.SO_RCVTIMEO, bounded)
        deliver_challenge(conn, key)
        answer_challenge(conn, key)
        # Authenticated: from now on a client may stay quiet as long as it likes.
        view.setsockopt(sockets.SOL_SOCKET, sockets.SO_RCVTIMEO, struct.pack("ll", 0, 0))


def main(argv: list[str]) -> int:
    """``python -m ptxgym.evaluate.judge_server SOCKET KEYFILE SETTINGS_JSON``: the shared server.
    ``python -m ptxgym.evaluate.judge_server private FD DEVICE SETTINGS_JSON FACTORY``: a private
    judge serving the socket inherited as descriptor FD (``start_private_judge``)."""
    if len(argv) == 5 and argv[0] == "private":
        settings = JudgeSettings(**json.loads(argv[3]))
        module, name = argv[4].split(":")
        factory = getattr(importlib.import_module(module), name)
        judge_main(Connection(int(argv[1])), int(argv[2]), settings, factory)
        return 0
    if len(argv) != 3:
        print(
            "usage: python -m ptxgym.evaluate.judge_server SOCKET KEYFILE SETTINGS_JSON",
            file=sys.stderr,
        )
        return 2
    settings = JudgeSettings(**json.loads(argv[2]))
    serve(Path(argv[0]), Path(argv[1]).read_text().strip().encode(), settings)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
