"""Action text → candidate source."""

from __future__ import annotations

import pytest

from ptxgym.languages.cuda.extract import MAX_ACTION_CHARS, extract_source

KERNEL = 'extern "C" int gemm() { return 0; }\n'


def test_bare_source_is_taken_whole() -> None:
    assert extract_source(KERNEL).source == KERNEL


def test_last_cuda_block_of_a_reply_is_taken() -> None:
    reply = (
        "Plan first.\n```cuda\n// draft\n```\nThen the final version:\n"
        f"```cuda\n{KERNEL}```\nand some python:\n```python\nprint(1)\n```\n"
    )
    assert extract_source(reply).source == KERNEL


@pytest.mark.parametrize("tag", ["cuda", "cpp", "c++", "CUDA", "cu", "c"])
def test_code_tags(tag: str) -> None:
    assert extract_source(f"Here:\n```{tag}\n{KERNEL}```\n").source == KERNEL


def test_untagged_block_when_no_tagged_one() -> None:
    assert extract_source(f"```\n{KERNEL}```").source == KERNEL


def test_unclosed_last_block_runs_to_the_end() -> None:
    assert extract_source(f"```cuda\n{KERNEL}").source == KERNEL


def test_only_other_languages_is_an_error() -> None:
    result = extract_source("```python\nprint(1)\n```")
    assert result.source is None
    assert "no ```cuda block" in (result.error or "")


@pytest.mark.parametrize(
    ("action", "message"),
    [
        ("", "empty"),
        ("   \n\t", "empty"),
        ("I think the answer is 42.", "no code found"),
        ("x" * (MAX_ACTION_CHARS + 1), "at most"),
        ("__global__ void k() {}\x00\x01", "binary"),
        ("__global__ void k() {} \udcff", "not valid UTF-8"),
        ("```cuda\n\n```", "empty"),
    ],
)
def test_bad_text_gives_a_reason(action: str, message: str) -> None:
    result = extract_source(action)
    assert result.source is None
    assert message in (result.error or "")


@pytest.mark.parametrize("action", [None, b"__global__", 42, ["code"]])
def test_non_string_raises_type_error(action: object) -> None:
    with pytest.raises(TypeError, match="must be a str"):
        extract_source(action)  # type: ignore[arg-type]
