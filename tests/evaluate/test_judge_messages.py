"""The messages on a judge's connection, without a judge (``ptxgym.evaluate.judge_messages``).

A request goes out and is read back as it was sent, its language included; an answer's payload is
checked for its kind; a message over the size limit is refused unread. What a judge does with a
refused message, and hostile peers on a real connection, are in
``tests/hostile/test_hostile_judge_server.py``.
"""

from __future__ import annotations

import json
from multiprocessing.connection import Pipe
from typing import Any

import pytest

from ptxgym.evaluate.judge_messages import (
    MessageError,
    Request,
    answer_message,
    read_answer,
    receive_message,
    send_message,
)
from ptxgym.evaluate.verdict import Verdict
from ptxgym.outcome import Status
from ptxgym.tasks import get_task

GEMM = get_task("PTX-H100-GEMM")


def test_the_language_travels_to_the_judge() -> None:
    triton = Request(7, None, GEMM, "/p/candidate.py", "triton")
    assert Request.from_message(json.loads(json.dumps(triton.message()))) == triton
    cuda = Request(8, None, GEMM, "/p/candidate.so")
    assert len(cuda.message()) == 5  # as before: a judge of an earlier version still serves it
    assert Request.from_message(cuda.message()).language == "cuda"
    for bad in ("rust", ["triton"]):
        with pytest.raises(MessageError, match="unknown language"):
            Request.from_message([*cuda.message(), bad])


def test_an_answer_crosses_as_json_and_is_read_back() -> None:
    verdict = Verdict(Status.PASSED, "fine")
    sent = json.loads(json.dumps(answer_message(3, "verdict", verdict)))
    assert read_answer(sent) == (3, "verdict", verdict)
    assert read_answer([4, "baseline", {"w": 2}]) == (4, "baseline", {"w": 2.0})
    assert read_answer([None, "ready", {"name": "gpu"}]) == (None, "ready", {"name": "gpu"})


@pytest.mark.parametrize(
    ("answer", "request_id", "reason"),
    [
        ([1, "verdict"], None, "3 parts"),
        ([True, "failed", "x"], None, "request id is not one"),
        ([5, "verdict", {"status": "PASSED"}], 5, "malformed verdict"),
        ([5, "baseline", {"w": "1.0"}], 5, "malformed answer"),
        ([5, "failed", {"why": "x"}], 5, "malformed answer"),
        ([5, "exec", "import os"], 5, "malformed answer"),
    ],
)
def test_a_malformed_answer_is_refused_naming_its_request(
    answer: list[Any], request_id: int | None, reason: str
) -> None:
    with pytest.raises(MessageError, match=reason) as refused:
        read_answer(answer)
    assert refused.value.request_id == request_id


def test_a_message_over_the_limit_is_not_read() -> None:
    # Both ends duplex, as a judge's are: a read-only end is closed outright on a frame too large.
    reader, writer = Pipe()
    send_message(writer, ["baseline", 1, None, "x" * 100])
    with pytest.raises(MessageError, match="over 50 bytes"):
        receive_message(reader, 50)
    reader.close()
    writer.close()


def test_a_message_must_be_a_non_empty_json_list() -> None:
    reader, writer = Pipe(duplex=False)
    for frame, reason in ((b"\x80\x04N.", "not a JSON message"), (b"{}", "non-empty JSON list")):
        writer.send_bytes(frame)
        with pytest.raises(MessageError, match=reason):
            receive_message(reader, 1000)
    send_message(writer, ["close"])
    assert receive_message(reader, 1000) == ["close"]
    reader.close()
    writer.close()
