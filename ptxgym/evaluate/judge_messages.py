"""The messages on a judge's connection: their format, and the checks each one passes before use.

Messages, on a private judge's pipe and the shared server's socket alike (``judge_server``), in
both directions, are JSON, never pickles: the judge is trusted and unconfined, and whoever can
write on its connection (a process that got the shared server's key) must not be able to run code
in it, nor a judge in its clients. Each message is one ``send_bytes`` frame of UTF-8 JSON, read
with a size limit (``MAX_REQUEST_BYTES``, ``MAX_ANSWER_BYTES``) and checked before use:

- a request is ``[kind, request_id, deadline, *arguments]``: ``["evaluate", id, deadline, task,
  library]`` (``library, language]`` for a language other than CUDA) or ``["baseline", id,
  deadline, task]``, where ``task`` is the task's JSON (``Task.model_dump(mode="json")``),
  ``library`` a path, ``language`` a name of ``ptxgym.languages.LANGUAGES``, ``id`` an integer
  and ``deadline`` a ``time.time()`` or null; ``["close"]`` ends the connection. The judge
  evaluates only its own registered tasks (``ptxgym.tasks.registry``): a task's callables are
  imported and called in the judge, so one named by the client is refused unless it is exactly
  the judge's task of that id.
- an answer is ``[request_id, kind, payload]``: ``verdict`` (``ptxgym.evaluate.verdict_json``),
  ``baseline`` (milliseconds per workload), ``failed`` or ``expired`` (a reason), and, with a
  null id, ``ready`` (the device facts) first, or ``failed`` before the connection is closed.

A message that fails its checks is a ``MessageError``, naming the request it concerns when it
named one: a request with wrong arguments is refused alone, a message that is not a request at all
(not JSON, no id, too large) leaves nothing to answer but the connection.
"""

from __future__ import annotations

import dataclasses
import json
import math
from multiprocessing.connection import Connection
from typing import Any, TypeGuard

from ptxgym.evaluate.verdict import Verdict
from ptxgym.evaluate.verdict_json import VerdictFormatError, verdict_from_json, verdict_to_json
from ptxgym.languages import DEFAULT_LANGUAGE, LANGUAGES
from ptxgym.tasks import Task, registry

# The largest task's JSON is about 10 kB; a request is the task, a path and a few numbers.
MAX_REQUEST_BYTES = 1 << 20
# A verdict is mostly bounded text (logs and findings are trimmed), but a profile lists every
# kernel the candidate launched, by its name: room for many.
MAX_ANSWER_BYTES = 64 << 20
_MAX_LIBRARY_CHARS = 4096


class MessageError(ValueError):
    """A message on a judge's connection that is not of the protocol (see the module).

    ``request_id``: the request it concerns, None when the message named none.
    """

    def __init__(self, reason: str, request_id: int | None = None) -> None:
        super().__init__(reason)
        self.request_id = request_id


@dataclasses.dataclass(frozen=True)
class Request:
    """A request to a judge: evaluate ``library`` on ``task``, or with no library, measure
    (or look up) the task's baseline."""

    request_id: int
    deadline: float | None
    task: Task
    library: str | None = None
    # The action language the library was built from (an evaluation's third argument, sent
    # only when it is not the default, so a judge of an earlier version still serves CUDA).
    language: str = DEFAULT_LANGUAGE

    @property
    def kind(self) -> str:
        return "baseline" if self.library is None else "evaluate"

    def message(self) -> list[Any]:
        """The request as the client sends it."""
        arguments: list[Any] = [self.task.model_dump(mode="json")]
        if self.library is not None:
            arguments.append(self.library)
            if self.language != DEFAULT_LANGUAGE:
                arguments.append(self.language)
        return [self.kind, self.request_id, self.deadline, *arguments]

    @classmethod
    def from_message(cls, message: list[Any]) -> Request:
        """The request ``message`` holds, checked; a MessageError otherwise."""
        request_id = message[1] if len(message) > 1 else None
        if not _is_request_id(request_id):
            raise MessageError(f"no request id in {str(message)[:80]}")
        kind = message[0]
        if kind not in ("evaluate", "baseline"):
            raise MessageError(f"unknown request {str(kind)[:40]!r}", request_id)
        arguments = message[3:]
        if len(arguments) not in ((2, 3) if kind == "evaluate" else (1,)):
            raise MessageError(f"wrong number of arguments for {kind}", request_id)
        deadline = message[2]
        if deadline is not None and not (_is_number(deadline) and math.isfinite(deadline)):
            raise MessageError("the deadline must be a time (seconds) or null", request_id)
        task = _registered_task(arguments[0], request_id)
        if kind == "baseline":
            return cls(request_id, deadline, task)
        library = arguments[1]
        if not isinstance(library, str) or not 0 < len(library) <= _MAX_LIBRARY_CHARS:
            raise MessageError("the library must be a path", request_id)
        if "\0" in library:
            raise MessageError("the library's path holds a NUL character", request_id)
        language = arguments[2] if len(arguments) == 3 else DEFAULT_LANGUAGE
        if not isinstance(language, str) or language not in LANGUAGES:
            raise MessageError(f"unknown language {str(language)[:40]!r}", request_id)
        return cls(request_id, deadline, task, library, language)


def _is_request_id(value: object) -> TypeGuard[int]:
    # A JSON true or false reads as a Python bool, which is an int too: refused.
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _registered_task(data: object, request_id: int) -> Task:
    """The judge's own task that ``data`` is the JSON of. A task's callables are imported and
    run in the judge, so ``data`` is compared with the registered task, never built into one."""
    try:
        tasks = registry()
    except (OSError, ValueError) as exc:
        raise MessageError(f"the judge's tasks could not be loaded: {exc}", request_id) from None
    task_id = data.get("id") if isinstance(data, dict) else None
    task = tasks.get(task_id) if isinstance(task_id, str) else None
    if task is None:
        raise MessageError(f"the judge has no task {str(task_id)[:80]!r}", request_id)
    if task.model_dump(mode="json") != data:
        raise MessageError(
            f"{task_id} differs from the judge's task of that id: its task file changed since "
            "the judge started",
            request_id,
        )
    return task


def send_message(conn: Connection, message: list[Any]) -> None:
    """Send ``message`` (JSON values) as one frame."""
    conn.send_bytes(json.dumps(message).encode())


def receive_message(conn: Connection, max_bytes: int) -> list[Any]:
    """The next message on ``conn``: a non-empty JSON list of at most ``max_bytes`` bytes, or a
    MessageError. A message over the limit is not read, and ``conn`` can no longer be read
    from (the frames' boundaries are lost). EOFError and OSError: the connection broke."""
    try:
        data = conn.recv_bytes(max_bytes)
    except OSError as exc:
        if not conn.closed and not conn.readable:  # what recv_bytes does to a frame too large
            raise MessageError(f"a message of over {max_bytes} bytes") from exc
        raise
    try:
        message = json.loads(data)
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, or nested too deep
        raise MessageError(f"not a JSON message ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(message, list) or not message:
        raise MessageError(f"a message must be a non-empty JSON list, not {str(message)[:80]}")
    return message


def answer_message(request_id: int | None, kind: str, payload: Any) -> list[Any]:
    """An answer as the judge sends it: a ``Verdict`` payload is written as JSON
    (``ptxgym.evaluate.verdict_json``), any other payload must be JSON values already."""
    if isinstance(payload, Verdict):
        payload = verdict_to_json(payload)
    return [request_id, kind, payload]


def read_answer(message: list[Any]) -> tuple[int | None, str, Any]:
    """``(request_id, kind, payload)`` of an answer, its payload checked for its kind (a
    ``Verdict`` for ``verdict``); a MessageError otherwise, with the request id if it had one."""
    if len(message) != 3:
        raise MessageError(f"an answer has 3 parts, not {len(message)}")
    request_id, kind, payload = message
    if request_id is not None and not _is_request_id(request_id):
        raise MessageError(f"an answer's request id is not one: {str(request_id)[:40]}")
    if kind == "verdict":
        try:
            return request_id, kind, verdict_from_json(payload)
        except VerdictFormatError as exc:
            raise MessageError(f"a malformed verdict: {exc}", request_id) from None
    if kind == "baseline" and isinstance(payload, dict) and all(map(_is_number, payload.values())):
        return request_id, kind, {str(name): float(ms) for name, ms in payload.items()}
    if kind == "ready" and isinstance(payload, dict):
        return request_id, kind, payload
    if kind in ("failed", "expired") and isinstance(payload, str):
        return request_id, kind, payload
    raise MessageError(f"a malformed answer of kind {str(kind)[:40]!r}", request_id)
