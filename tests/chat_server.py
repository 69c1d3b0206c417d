"""A scripted OpenAI-compatible chat server on 127.0.0.1, for tests.

Tests of ptxgym's LLM agent talk to it with the real ``openai`` client over real HTTP, so that
what is tested is what runs: the client's request encoding, authentication, retries, timeouts
and error classes, against a server whose replies the test scripts. It serves

* ``POST /v1/chat/completions`` in the Chat Completions wire format (no streaming), and
* ``GET /v1/models``, the configured model list,

both behind a bearer ``api_key`` (401 ``invalid_api_key`` otherwise). A model outside the list
gets 404, malformed JSON 400, and an exception in the test's script 500 (kept in
``server.errors``); nothing a request does stops the server.

Use::

    from chat_server import ChatServer, Step, scripted

    with ChatServer(scripted(Step.rate_limited(), Step("done")), api_key="k") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=2)
        client.chat.completions.create(model="test-model", messages=[...])
        assert [r.status for r in server.requests] == [429, 200]

``replies`` is called once per valid chat request with its :class:`ChatRequest` (parsed body,
1-based ``number``, conversation ``turn``) and returns the :class:`Step` to answer with.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"

_ERROR_KINDS = {  # status -> (error type, error code), as the OpenAI API sends them
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
}


@dataclass(frozen=True)
class Step:
    """How to answer one chat request.

    ``text`` is the assistant's content (or, for a status other than 200, the error message);
    ``delay_s`` is slept before answering; ``drop`` closes the connection without a response;
    ``retry_after`` (seconds) is sent as a ``Retry-After`` header.
    """

    text: str = ""
    status: int = 200
    delay_s: float = 0.0
    drop: bool = False
    retry_after: float | None = None
    finish_reason: str = "stop"

    def __post_init__(self) -> None:
        if not 200 <= self.status <= 599:
            raise ValueError(f"status {self.status} is not a final HTTP status")
        if self.delay_s < 0:
            raise ValueError("delay_s must be >= 0")

    @classmethod
    def rate_limited(cls, retry_after: float | None = 0.05) -> Step:
        """429 with an OpenAI error body and, unless None, a ``Retry-After`` header."""
        return cls("Rate limit reached (scripted).", status=429, retry_after=retry_after)

    @classmethod
    def server_error(cls, message: str = "The server had an error (scripted).") -> Step:
        """500 with an OpenAI error body."""
        return cls(message, status=500)

    @classmethod
    def dropped(cls) -> Step:
        """Close the connection without sending anything back."""
        return cls(drop=True)


@dataclass(frozen=True)
class ChatRequest:
    """One HTTP request the server received (any path, including rejected ones)."""

    number: int  # 1-based position in ``server.requests``: counts every request, retries too
    method: str
    path: str
    headers: Mapping[str, str]  # names in lower case
    body: dict[str, Any]  # the parsed JSON object; {} for a GET or a body that is not one
    received_at: float  # time.monotonic() on arrival
    status: int = 0  # the status answered; 0 for a dropped connection (or not answered yet)

    @property
    def model(self) -> str:
        return str(self.body.get("model", ""))

    @property
    def messages(self) -> list[dict[str, Any]]:
        messages = self.body.get("messages")
        return list(messages) if isinstance(messages, list) else []

    @property
    def turn(self) -> int:
        """Conversation turn: assistant messages already in ``messages``, plus one."""
        return 1 + sum(
            1 for m in self.messages if isinstance(m, dict) and m.get("role") == "assistant"
        )


Replies = Callable[[ChatRequest], Step]


def scripted(*steps: Step) -> Replies:
    """``replies`` that answers with ``steps`` in order, then repeats the last (thread-safe)."""
    if not steps:
        raise ValueError("scripted() needs at least one step")
    lock = threading.Lock()
    counter = itertools.count()

    def replies(request: ChatRequest) -> Step:
        with lock:
            index = next(counter)
        return steps[min(index, len(steps) - 1)]

    return replies


def estimate_tokens(text: str) -> int:
    """The server's deterministic token count: a quarter of the characters, at least 1."""
    return max(1, len(text) // 4)


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


@dataclass
class _Reply:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> _Reply:
    kind, code = _ERROR_KINDS.get(status, ("server_error" if status >= 500 else "api_error", None))
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return _Reply(status, body, headers or {})


class ChatServer:
    """A scripted OpenAI-compatible server on 127.0.0.1 (ephemeral port), in a daemon thread.

    Started on construction; stop it with :meth:`close` or by leaving a ``with`` block.
    """

    def __init__(
        self,
        replies: Replies,
        *,
        api_key: str = "test-key",
        models: Sequence[str] = ("test-model",),
    ) -> None:
        self.replies = replies
        self.api_key = api_key
        self.models = tuple(models)
        self.errors: list[
            BaseException
        ] = []  # raised while answering, by ``replies`` or here (500)
        self._requests: list[ChatRequest] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._httpd = _HTTPServer(self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"ChatServer:{self.port}",
            daemon=True,
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def requests(self) -> list[ChatRequest]:
        """A snapshot of every request received so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    @property
    def completions(self) -> list[ChatRequest]:
        """The requests to ``/v1/chat/completions`` only."""
        return [r for r in self.requests if r.path == CHAT_PATH]

    def close(self) -> None:
        """Stop serving, cut open connections and wake delayed answers (idempotent)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._httpd.shutdown()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            _shutdown(connection)
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ChatServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- used by the handler ---------------------------------------------------------------

    def _record(self, method: str, path: str, headers: Mapping[str, str], body: object) -> int:
        with self._lock:
            number = len(self._requests) + 1
            self._requests.append(
                ChatRequest(
                    number=number,
                    method=method,
                    path=path,
                    headers=dict(headers),
                    body=body if isinstance(body, dict) else {},
                    received_at=time.monotonic(),
                )
            )
        return number

    def _set_status(self, number: int, status: int) -> None:
        with self._lock:
            self._requests[number - 1] = replace(self._requests[number - 1], status=status)

    def _answer(
        self, method: str, path: str, headers: Mapping[str, str], raw: bytes
    ) -> _Reply | None:
        """The reply to one request, or None to drop the connection."""
        try:
            body: object = json.loads(raw) if raw else None
        except ValueError:
            body = None
        number = self._record(method, path, headers, body)
        reply = self._reply(number, method, path, headers, raw, body)
        self._set_status(number, 0 if reply is None else reply.status)
        return reply

    def _reply(
        self,
        number: int,
        method: str,
        path: str,
        headers: Mapping[str, str],
        raw: bytes,
        body: object,
    ) -> _Reply | None:
        if path not in (CHAT_PATH, MODELS_PATH):
            return _error(404, f"Unknown path {method} {path}.")
        if headers.get("authorization") != f"Bearer {self.api_key}":
            return _error(401, "Incorrect API key provided.")
        if path == MODELS_PATH:
            if method != "GET":
                return _error(405, f"{method} is not allowed on {path}.")
            data = [
                {"id": m, "object": "model", "created": 0, "owned_by": "test"} for m in self.models
            ]
            return _Reply(200, {"object": "list", "data": data})
        if method != "POST":
            return _error(405, f"{method} is not allowed on {path}.")
        if not isinstance(body, dict):
            return _error(400, "The request body is not a JSON object." if raw else "No body.")
        if not isinstance(body.get("model"), str):
            return _error(400, "'model' is required and must be a string.")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error(400, "'messages' must be a non-empty list.")
        if body["model"] not in self.models:
            return _error(404, f"The model `{body['model']}` does not exist.")
        if body.get("stream"):
            return _error(400, "This test server does not stream.")

        request = self.requests[number - 1]
        try:
            step = self.replies(request)
        except Exception as exc:  # a bug in the test's script: answer 500, keep serving
            with self._lock:
                self.errors.append(exc)
            return _error(500, f"replies() raised {exc!r}")
        if step.delay_s > 0 and self._stopping.wait(step.delay_s):
            return None  # closing: drop the connection rather than answer
        if step.drop:
            return None
        extra = {} if step.retry_after is None else {"Retry-After": format(step.retry_after, "g")}
        if step.status != 200:
            return _error(step.status, step.text or f"Scripted HTTP {step.status}.", extra)
        prompt = "".join(_content_text(m.get("content")) for m in messages if isinstance(m, dict))
        prompt_tokens, completion_tokens = estimate_tokens(prompt), estimate_tokens(step.text)
        completion = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": step.text, "refusal": None},
                    "finish_reason": step.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
        return _Reply(200, completion, extra)


def _shutdown(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):
        connection.shutdown(socket.SHUT_RDWR)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the default 5 makes a burst of connects wait for SYN retries

    def __init__(self, owner: ChatServer) -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away mid-request; the default prints a traceback


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the openai client expects
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        with self.server.owner._lock:
            self.server.owner._connections.add(self.connection)

    def finish(self) -> None:
        with self.server.owner._lock:
            self.server.owner._connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no request log on stderr

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _handle(self, method: str) -> None:
        owner = self.server.owner
        headers = {name.lower(): value for name, value in self.headers.items()}
        try:
            length = int(headers.get("content-length", "0"))
            raw = self.rfile.read(length) if length > 0 else b""
        except (ValueError, OSError):
            self.close_connection = True
            raw = b""
        try:
            reply = owner._answer(method, self.path.split("?", 1)[0], headers, raw)
        except Exception as exc:  # never let a request kill the server
            with owner._lock:
                owner.errors.append(exc)
            reply = _error(500, f"The test server failed: {exc!r}")
        if reply is None:
            self.close_connection = True
            _shutdown(self.connection)
            return
        payload = json.dumps(reply.body).encode()
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except OSError:  # the client gave up (e.g. its timeout) before the answer
            self.close_connection = True
