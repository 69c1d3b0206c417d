"""The scripted chat server, exercised with the real ``openai`` client over real HTTP: what the
agent's tests rely on (replies, usage, recorded requests, errors the client raises, its retries,
timeouts and concurrency) holds."""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from typing import Any

import openai
import pytest
from chat_server import ChatRequest, ChatServer, Step, estimate_tokens, scripted

KEY = "sk-test-key"
MODEL = "test-model"
MESSAGES: list[Any] = [
    {"role": "system", "content": "You write PTX."},
    {"role": "user", "content": "Write a kernel."},
]


def client(server: ChatServer, **options: Any) -> openai.OpenAI:
    options.setdefault("max_retries", 0)
    options.setdefault("api_key", KEY)
    return openai.OpenAI(base_url=server.base_url, **options)


def ask(server: ChatServer, **options: Any) -> openai.types.chat.ChatCompletion:
    with client(server, **options) as c:
        return c.chat.completions.create(model=MODEL, messages=MESSAGES)


def post_raw(server: ChatServer, body: bytes) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_reply_with_usage() -> None:
    with ChatServer(scripted(Step("mov.u32 %r1, 0;")), api_key=KEY) as server:
        completion = ask(server)
    assert completion.id.startswith("chatcmpl-")
    assert completion.model == MODEL
    choice = completion.choices[0]
    assert (choice.message.role, choice.message.content) == ("assistant", "mov.u32 %r1, 0;")
    assert choice.finish_reason == "stop"
    usage = completion.usage
    assert usage is not None
    prompt = "You write PTX." + "Write a kernel."
    assert usage.prompt_tokens == estimate_tokens(prompt)
    assert usage.completion_tokens == estimate_tokens("mov.u32 %r1, 0;")
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_records_request_and_passes_it_to_replies() -> None:
    seen: list[ChatRequest] = []

    def replies(request: ChatRequest) -> Step:
        seen.append(request)
        return Step(f"turn {request.turn}", finish_reason="length")

    messages: list[Any] = [*MESSAGES, {"role": "assistant", "content": "..."}]
    messages.append({"role": "user", "content": "Again."})
    with ChatServer(replies, api_key=KEY) as server, client(server) as c:
        completion = c.chat.completions.create(
            model=MODEL,
            messages=messages,
            temperature=0.2,
            top_p=0.9,
            max_completion_tokens=64,
            seed=7,
            reasoning_effort="low",
        )
        (request,) = server.requests
    assert completion.choices[0].message.content == "turn 2"
    assert completion.choices[0].finish_reason == "length"
    assert [(r.number, r.body) for r in seen] == [(1, request.body)]
    assert (request.number, request.turn, request.status) == (1, 2, 200)
    assert (request.method, request.path) == ("POST", "/v1/chat/completions")
    assert request.model == MODEL
    assert request.messages == messages
    body = request.body
    assert (body["temperature"], body["top_p"], body["max_completion_tokens"]) == (0.2, 0.9, 64)
    assert (body["seed"], body["reasoning_effort"]) == (7, "low")
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.received_at <= time.monotonic()


def test_models_list() -> None:
    with (
        ChatServer(scripted(Step("x")), api_key=KEY, models=["a", "b"]) as server,
        client(server) as c,
    ):
        assert [m.id for m in c.models.list()] == ["a", "b"]


def test_wrong_key_is_401() -> None:
    with ChatServer(scripted(Step("x")), api_key=KEY) as server:
        with pytest.raises(openai.AuthenticationError) as caught:
            ask(server, api_key="sk-wrong")
        assert caught.value.status_code == 401
        assert caught.value.code == "invalid_api_key"
        assert [r.status for r in server.requests] == [401]


def test_unknown_model_is_404() -> None:
    with (
        ChatServer(scripted(Step("x")), api_key=KEY) as server,
        client(server) as c,
        pytest.raises(openai.NotFoundError),
    ):
        c.chat.completions.create(model="no-such-model", messages=MESSAGES)


def test_rate_limited() -> None:
    with ChatServer(scripted(Step.rate_limited(retry_after=0.05)), api_key=KEY) as server:
        with pytest.raises(openai.RateLimitError) as caught:
            ask(server)
        assert caught.value.response.headers["retry-after"] == "0.05"
        assert len(server.requests) == 1


def test_client_retries_429_then_succeeds() -> None:
    replies = scripted(Step.rate_limited(retry_after=0.05), Step("after the wait"))
    with ChatServer(replies, api_key=KEY) as server:
        completion = ask(server, max_retries=2)
        requests = server.requests
    assert completion.choices[0].message.content == "after the wait"
    assert [r.status for r in requests] == [429, 200]
    assert requests[1].received_at - requests[0].received_at >= 0.05
    assert [r.headers["x-stainless-retry-count"] for r in requests] == ["0", "1"]


def test_server_error() -> None:
    with (
        ChatServer(scripted(Step.server_error()), api_key=KEY) as server,
        pytest.raises(openai.InternalServerError),
    ):
        ask(server)


def test_dropped_connection_then_recovery() -> None:
    with ChatServer(scripted(Step.dropped(), Step("back")), api_key=KEY) as server:
        with pytest.raises(openai.APIConnectionError) as caught:
            ask(server)
        assert not isinstance(caught.value, openai.APITimeoutError)
        assert ask(server).choices[0].message.content == "back"
        assert [r.status for r in server.requests] == [0, 200]


def test_slow_reply_times_out() -> None:
    with ChatServer(scripted(Step("late", delay_s=1.0)), api_key=KEY) as server:
        start = time.monotonic()
        with pytest.raises(openai.APITimeoutError):
            ask(server, timeout=0.3)
        assert time.monotonic() - start < 0.9


def test_bad_requests_do_not_stop_the_server() -> None:
    def replies(request: ChatRequest) -> Step:
        if request.number == 3:
            raise RuntimeError("bug in the script")
        return Step("fine")

    with ChatServer(replies, api_key=KEY) as server:
        status, body = post_raw(server, b"{not json")
        assert (status, body["error"]["type"]) == (400, "invalid_request_error")
        status, body = post_raw(server, b'{"model": "test-model"}')
        assert status == 400
        with pytest.raises(openai.InternalServerError):
            ask(server)
        assert [str(e) for e in server.errors] == ["bug in the script"]
        assert ask(server).choices[0].message.content == "fine"
        # Streaming is refused, not half-served.
        with client(server) as c, pytest.raises(openai.BadRequestError):
            c.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)


def test_async_client_is_served_concurrently() -> None:
    def replies(request: ChatRequest) -> Step:
        return Step(f"reply {request.messages[-1]['content']}", delay_s=0.3)

    async def run(server: ChatServer) -> list[str | None]:
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key=KEY, max_retries=0) as c:
            completions = await asyncio.gather(
                *(
                    c.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": str(i)}]
                    )
                    for i in range(8)
                )
            )
        return [completion.choices[0].message.content for completion in completions]

    with ChatServer(replies, api_key=KEY) as server:
        start = time.monotonic()
        contents = asyncio.run(run(server))
        elapsed = time.monotonic() - start
        assert len(server.requests) == 8
    assert contents == [f"reply {i}" for i in range(8)]
    assert elapsed < 8 * 0.3 / 2
