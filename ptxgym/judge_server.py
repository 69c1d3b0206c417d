"""Serving a judge: to the one process that started it, or to every process of the user.

``judge_main`` is the process entry of a judge private to one evaluator process (its requests
come over a pipe). ``serve_connection`` answers the requests of one connection; both it and the
shared server use it.

The shared judge: one server per GPU and settings, on a Unix socket.

Envs in different processes (``AsyncVectorEnv`` workers, separate training processes) that ask
for a shared judge (``LocalGPUEvaluator(shared=True)``) all talk to the same judge process. It
keeps one copy of each workload's references and inputs seeds, one baseline measurement, one pool
of spare workers, and it overlaps their requests as a judge does for threads. The first process
that needs the server starts it, detached (it outlives that process); it stops by itself once no
process has been connected for ``IDLE_S`` seconds.

The socket and its key live in ptxgym's cache folder, readable by the user only. Connections
authenticate with the key (``multiprocessing.connection``), so only the user's processes can
submit work or read verdicts. Messages are pickled, which is safe between processes of one user.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

from ptxgym import paths
from ptxgym.gpus import physical_device
from ptxgym.judge import Judge, JudgeSettings

IDLE_S = 120.0
_START_TIMEOUT_S = 600.0


def judge_main(
    conn: Connection,
    device: int,
    settings: JudgeSettings,
    factory: Callable[[int, JudgeSettings], Judge] = Judge,
) -> None:
    """Process entry of a judge private to one evaluator process: serve ``conn`` until it closes.

    ``factory`` makes the judge (tests give a stand-in that needs no GPU).
    """
    try:
        judge = factory(device, settings)
    except Exception as exc:
        conn.send((None, "failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send((None, "ready", judge.device_info))
    with ThreadPoolExecutor(max_workers=settings.concurrency) as pool:
        serve_connection(conn, judge, pool)
        pool.shutdown(wait=False, cancel_futures=True)
    judge.close()


def serve_connection(conn: Connection, judge: Judge, pool: ThreadPoolExecutor) -> None:
    """Answer the requests that arrive on ``conn`` until it closes or says ``close``.

    A request is ``(kind, request_id, deadline, *arguments)``, kind ``evaluate`` or ``baseline``;
    each is served by ``pool`` (in the order received, as many at once as the pool has threads)
    and answered on ``conn`` with ``(request_id, kind, payload)``. A request still queued when its
    deadline (``time.time()`` seconds, or None) passes is answered ``expired`` and not served.
    """
    send_lock = threading.Lock()

    def answer(request_id: int, kind: str, payload: Any) -> None:
        try:
            with send_lock:
                conn.send((request_id, kind, payload))
        except (OSError, ValueError):
            pass  # the asker has gone; nobody is left to tell

    def serve(kind: str, request_id: int, deadline: float | None, *arguments: Any) -> None:
        if deadline is not None and time.time() > deadline:
            answer(request_id, "expired", "the request waited past its deadline in the queue")
            return
        try:
            if kind == "evaluate":
                answer(request_id, "verdict", judge.evaluate(*arguments))
            elif kind == "baseline":
                answer(request_id, "baseline", judge.baseline_ms(*arguments))
            else:
                answer(request_id, "failed", f"unknown request {kind!r}")
        except Exception as exc:  # an evaluator bug or a missing dependency: report, keep serving
            answer(request_id, "failed", f"{type(exc).__name__}: {exc}")

    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            break
        if request[0] == "close":
            break
        pool.submit(serve, *request)


@dataclasses.dataclass(frozen=True)
class ServerFiles:
    """Where the server of one (GPU, settings) listens, its key, its start lock and its log."""

    socket: Path
    key: Path
    lock: Path
    log: Path


def server_files(device: int, settings: JudgeSettings) -> ServerFiles:
    """The files of the server for CUDA device ``device`` of this process and ``settings``."""
    physical = physical_device(device).replace("/", "_")
    digest = hashlib.sha256(
        json.dumps(dataclasses.asdict(settings), sort_keys=True).encode()
    ).hexdigest()[:12]
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
            _, kind, payload = conn.recv()
        except (EOFError, OSError):
            conn.close()
            continue
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
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ptxgym.judge_server",
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
    listener = Listener(str(socket), family="AF_UNIX", authkey=key)
    os.chmod(socket, 0o600)
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
            conn.send((None, "ready", judge.device_info))
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
            except (OSError, EOFError, AuthenticationError):
                continue  # the periodic wake-up, or a client that failed to authenticate
            with mutex:
                if stopping.is_set():
                    conn.close()
                    break
                active += 1
            threading.Thread(target=handle, args=(conn,), daemon=True).start()
    with contextlib.suppress(OSError):  # it unlinks the socket, which may be gone already
        listener.close()
    judge.close()


def main(argv: list[str]) -> int:
    """``python -m ptxgym.judge_server SOCKET KEYFILE SETTINGS_JSON``."""
    if len(argv) != 3:
        print("usage: python -m ptxgym.judge_server SOCKET KEYFILE SETTINGS_JSON", file=sys.stderr)
        return 2
    settings = JudgeSettings(**json.loads(argv[2]))
    serve(Path(argv[0]), Path(argv[1]).read_text().strip().encode(), settings)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
