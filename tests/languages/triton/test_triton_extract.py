"""Action text → Triton module (``ptxgym.languages.triton.extract``)."""

from __future__ import annotations

import pytest

from ptxgym.languages.base import MAX_ACTION_CHARS
from ptxgym.languages.triton.extract import extract_source

MODULE = "import triton\nimport triton.language as tl\n\n\ndef gemm(A, B, C, M, N, K):\n    pass\n"


def test_a_bare_module_is_taken_whole() -> None:
    assert extract_source(MODULE).source == MODULE


def test_the_last_python_block_of_a_reply_is_taken() -> None:
    reply = (
        "A draft:\n```python\n# draft\n```\nThe final version:\n"
        f"```python\n{MODULE}```\nand how it lowers:\n```ptx\nwgmma\n```\n"
    )
    assert extract_source(reply).source == MODULE


@pytest.mark.parametrize("tag", ["python", "py", "Python", "triton", "python3"])
def test_code_tags(tag: str) -> None:
    assert extract_source(f"Here:\n```{tag}\n{MODULE}```\n").source == MODULE


def test_an_untagged_block_when_no_tagged_one() -> None:
    assert extract_source(f"```\n{MODULE}```").source == MODULE


def test_only_other_languages_is_an_error() -> None:
    result = extract_source("```cuda\n__global__ void k() {}\n```")
    assert result.source is None
    assert "no ```python block" in (result.error or "")


@pytest.mark.parametrize(
    ("action", "message"),
    [
        ("", "empty"),
        ("I could not write it.", "no code found"),
        ("```python\n\n```", "block is empty"),
        ("import triton\x00", "binary data"),
        ("x" * (MAX_ACTION_CHARS + 1), "at most"),
        ("import triton\n\udcff", "not valid UTF-8"),
    ],
)
def test_bad_actions_say_why(action: str, message: str) -> None:
    result = extract_source(action)
    assert result.source is None
    assert message in (result.error or "")


def test_a_non_string_action_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="must be a str"):
        extract_source(b"import triton")  # type: ignore[arg-type]
