"""Hostile lexing: spellings that a text scan reads differently from the compiler, and inputs
sized to make a super-linear text stage hang.

Each family is generated over its edge cases: every way of splicing a line inside a directive
the policy must refuse, digit separators before a forbidden include or ``.incbin``, every
spelling of ``#pragma GCC dependency``, character literals holding ``"`` next to split string
literals in preprocessed text, line-control directives, and large adversarial actions and
sources that must go through extraction and the policy within a fixed time budget.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from ptxgym.languages.cuda.compiler import _assembler_escape
from ptxgym.languages.cuda.extract import MAX_ACTION_CHARS, extract_source
from ptxgym.languages.cuda.policy import MAX_SOURCE_CHARS, check_policy
from ptxgym.tasks import get_task

TASK = get_task("PTX-H100-GEMM")
ENTRY = (
    'extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C,\n'
    "                    int M, int N, int K, cudaStream_t stream) { return 0; }\n"
)
SECRET = "/etc/passwd"


def violations(source: str) -> str:
    return "\n".join(check_policy(source, TASK).violations)


def misses(sources: dict[str, str], message: str) -> list[str]:
    """The labels of the sources whose violations do not mention ``message``."""
    return [label for label, source in sources.items() if message not in violations(source)]


# ------------------------------------------------------------------------------------------
# Line splices: a backslash, any horizontal whitespace gcc accepts, and any line end

SPLICE_SPACES = ["", " ", "\t", "\f", "\v", " \t", "\f \v\t"]
LINE_ENDS = ["\n", "\r\n", "\r"]
# (the directive up to its argument, the argument, what the policy must say)
REFUSED_DIRECTIVES = {
    "include": ("#include", f' "{SECRET}"', "never by path"),
    "include_next": ("#include_next", f" <{SECRET}>", "never by path"),
    "import": ("#import", f' "{SECRET}"', "never by path"),
    "embed": ("#embed", f' "{SECRET}"', "#embed"),
    "line": ("#line 12", f' "{SECRET}"', "line-control"),
    "linemarker": ("# 12", f' "{SECRET}"', "line-control"),
    "pragma_dependency": ("#pragma GCC dependency", f' "{SECRET}"', "not allowed"),
    "has_include": ("#if __has_include", f'("{SECRET}")\n#endif', "never by path"),
}


@pytest.mark.parametrize("name", REFUSED_DIRECTIVES)
def test_a_line_splice_anywhere_in_a_directive_hides_nothing(name: str) -> None:
    head, argument, message = REFUSED_DIRECTIVES[name]
    sources = {}
    for hash_spelling in ("#", "%:"):
        spelled = hash_spelling + head[1:]
        for cut in range(1, len(spelled) + 1):
            for spaces in SPLICE_SPACES:
                for line_end in LINE_ENDS:
                    directive = f"{spelled[:cut]}\\{spaces}{line_end}{spelled[cut:]}{argument}"
                    label = f"{directive!r}"
                    sources[label] = f"int before;\n{directive}\n{ENTRY}"
    assert not misses(sources, message)


# ------------------------------------------------------------------------------------------
# Digit separators: a naive scan takes the quote for a character literal, and the next quote
# then leaves it in a "comment" that the compiler never sees.

SEPARATED_NUMBERS = [
    "1'2",
    "1'000'000'000",
    "0x1'ff",
    "0X1'FFu",
    "0b1'0",
    "0'7",
    "1'2ull",
    "1.0'5f",
    ".5'5",
    "1e1'0",
    "0x1p1'0",
    "1'_suffix",
]
NUMBER_PLACES = [
    "int v = {number} + '/*';",
    "int a[{number}] = {{'/*'}};",
    "#define N {number} + '/*'",
    "static_assert({number} != '/*', \"\");",
]
HIDDEN_PAYLOADS = {
    f'#include "{SECRET}"': "never by path",
    f'asm(".incbin \\"{SECRET}\\"");': ".incbin",
    f'#line 1 "{SECRET}"': "line-control",
    f'#pragma GCC dependency "{SECRET}"': "not allowed",
}


@pytest.mark.parametrize("number", SEPARATED_NUMBERS)
def test_digit_separators_hide_nothing_that_follows(number: str) -> None:
    found_misses = []
    for place in NUMBER_PLACES:
        for payload, message in HIDDEN_PAYLOADS.items():
            source = f"{place.format(number=number)}\n{payload}\nint w = '*/';\n{ENTRY}"
            found_misses += misses({f"{place} / {payload}": source}, message)
    assert not found_misses


# ------------------------------------------------------------------------------------------
# #pragma GCC dependency: a file-existence and file-age oracle, however it is spelled

DEPENDENCY_SEPARATORS = ["", " ", "\t", "\f", "\v", "/**/", "\\\n"]
DEPENDENCY_ARGUMENTS = [f'"{SECRET}"', f"<{SECRET}>"]


def _directive_pragma(hash_spelling: str, gap: str) -> Callable[[str, str], str]:
    return lambda separator, argument: (
        f"{hash_spelling}{gap}pragma{gap}GCC{gap}dependency{separator}{argument}"
    )


def _operator_pragma(prefix: str, in_macro: bool) -> Callable[[str, str], str]:
    def spell(separator: str, argument: str) -> str:
        escaped = argument.replace('"', '\\"')
        operator = f'_Pragma({prefix}"GCC dependency{separator}{escaped}")'
        return f"#define P {operator}\nP" if in_macro else operator

    return spell


PRAGMA_CARRIERS = {
    "directive": _directive_pragma("#", " "),
    "digraph": _directive_pragma("%:", " "),
    "tabs": _directive_pragma("#", "\t"),
    "form_feeds": _directive_pragma("\f#", "\f"),
    "operator": _operator_pragma("", in_macro=False),
    "wide_operator": _operator_pragma("L", in_macro=False),
    "operator_in_macro": _operator_pragma("", in_macro=True),
}


@pytest.mark.parametrize("carrier", PRAGMA_CARRIERS)
def test_every_spelling_of_pragma_dependency_is_refused(carrier: str) -> None:
    spell = PRAGMA_CARRIERS[carrier]
    sources = {
        repr(spell(separator, argument)): f"{spell(separator, argument)}\n{ENTRY}"
        for separator in DEPENDENCY_SEPARATORS
        for argument in DEPENDENCY_ARGUMENTS
    }
    assert not misses(sources, "not allowed")


# ------------------------------------------------------------------------------------------
# The preprocessed-source scan: a character literal holding '"' must not pair with the quotes
# of string literals, or adjacent literals are joined wrongly and an .incbin hides.

QUOTE_CHARACTERS = ["'\"'", "u8'\"'", "L'\"'", "u'\"'", "U'\"'", "'\\\"'", "'\"\"'", "'\"\\''"]
SPLIT_RUNS = {
    f'".inc" "bin \\"{SECRET}\\""': ".incbin",
    f'".in" "cl" "ude \\"{SECRET}\\""': ".include",
    '".ir" "p d,bin"': ".irp",
    '"sys" "call"': "syscall",
    f'"\\x2einc" "bin \\"{SECRET}\\""': ".incbin",
    f'".inc"\n# 12 "candidate.cu"\n"bin \\"{SECRET}\\""': ".incbin",
    '".re" u8"pt 3"': ".rept",
}
RUN_PLACES = [
    "char c = {quote}; asm({run});",
    "f({quote}); asm volatile({run});",
    "char c = {quote};\nasm({run});",
    "int x = {quote} + 1; __asm__({run} : : );",
]


@pytest.mark.parametrize("quote", QUOTE_CHARACTERS)
def test_character_literals_holding_quotes_do_not_hide_split_literals(quote: str) -> None:
    found_misses = []
    for place in RUN_PLACES:
        for run, directive in SPLIT_RUNS.items():
            preprocessed = (
                '# 1 "candidate.cu"\n' + place.format(quote=quote, run=run) + "\nint z;\n"
            )
            found = _assembler_escape(preprocessed)
            if found is None or directive not in found.lower():
                found_misses.append(f"{preprocessed!r} -> {found!r}")
    assert not found_misses


# ------------------------------------------------------------------------------------------
# Line control: the compiler would attribute diagnostics to another file, and quote its lines

LINE_CONTROL = [
    f'#line 1 "{SECRET}"',
    "#line 1",
    f'#line 0x10 "{SECRET}"',
    "#line LINE_MACRO",
    f'# 1 "{SECRET}"',
    f'# 1 "{SECRET}" 1 3 4',
    f'#1"{SECRET}"',
    f'# 1\'0 "{SECRET}"',
    f'%:line 1 "{SECRET}"',
    f'%: 1 "{SECRET}"',
    "#\tline 1",
    "#\fline\f1",
    "\v#\vline 1",
    "#/**/line 1",
    "# /* a\n b */ line 1",
    "#li\\\nne 1",
    "#\\\f\nline 1",
    "#li\\\r\nne 1",
    f'#if 0\n#line 1 "{SECRET}"\n#endif',
    f'#define X\n#line __LINE__ "{SECRET}"',
]


@pytest.mark.parametrize("directive", LINE_CONTROL, ids=repr)
def test_line_control_directives_are_refused(directive: str) -> None:
    assert "line-control" in violations(f"int a;\n{directive}\n{ENTRY}")


# ------------------------------------------------------------------------------------------
# Time: every text stage is linear, so adversarial inputs of the largest accepted sizes go
# through extraction and the policy within a budget; quadratic stages take minutes on some of
# them. Each input has the whole budget to itself.

TEXT_PIPELINE_BUDGET_S = 10.0
"""Generous for a slow, shared 2-core machine, where linear stages need a second or two."""


class _OverBudget(Exception):
    pass


def _interrupt(signum: int, frame: object) -> None:
    raise _OverBudget


@contextmanager
def _interrupted_after(seconds: float) -> Iterator[None]:
    """Raise ``_OverBudget`` in the body (a regular expression search included) after
    ``seconds``."""
    previous = signal.signal(signal.SIGALRM, _interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def over_budget(inputs: dict[str, str], stage: Callable[[str], object]) -> list[str]:
    """The inputs that ``stage`` does not get through within the budget, each with its time."""
    slow = []
    for name, text in inputs.items():
        started = time.perf_counter()
        try:
            with _interrupted_after(TEXT_PIPELINE_BUDGET_S):
                stage(text)
        except _OverBudget:
            slow.append(f"{name}: stopped after {TEXT_PIPELINE_BUDGET_S:.0f} s")
            continue
        if (seconds := time.perf_counter() - started) >= TEXT_PIPELINE_BUDGET_S:
            slow.append(f"{name}: {seconds:.1f} s")
    return slow


def _repeat(unit: str, size: int) -> str:
    return unit * (size // len(unit))


def _text_pipeline(action: str) -> None:
    """What the env process does with an action before anything compiles: extract, check."""
    extraction = extract_source(action)
    if extraction.source is not None:
        check_policy(extraction.source, TASK)


ADVERSARIAL_ACTIONS = {
    "backticks": "`" * MAX_ACTION_CHARS,
    "backticks_then_spaces": "```" + " " * (MAX_ACTION_CHARS - 3),
    "openers": _repeat("```\n", MAX_ACTION_CHARS),
    "tagged_openers": _repeat("```cuda\n", MAX_ACTION_CHARS),
    "long_fences": _repeat("`" * 997 + "\n", MAX_ACTION_CHARS),
    "openers_without_newline": _repeat("``` ```x", MAX_ACTION_CHARS),
    "fence_in_a_block": "```cuda\n" + _repeat(" ```` x\n", MAX_ACTION_CHARS - 8),
    "code_hints": _repeat('extern extern "# # asm asm volatile ', MAX_ACTION_CHARS),
}


def test_adversarial_actions_go_through_extraction_and_the_policy_within_budget() -> None:
    assert all(len(action) <= MAX_ACTION_CHARS for action in ADVERSARIAL_ACTIONS.values())
    slow = over_budget(ADVERSARIAL_ACTIONS, _text_pipeline)
    assert not slow, slow


ADVERSARIAL_SOURCES = {
    "adjacent_literals": _repeat('"a" ', MAX_SOURCE_CHARS),
    "quotes": "'" * MAX_SOURCE_CHARS,
    "raw_string_openers": _repeat('R"', MAX_SOURCE_CHARS),
    "raw_strings_in_a_directive": "#define X " + _repeat('R"(a)" ', MAX_SOURCE_CHARS - 20),
    "comment_openers": _repeat("/*", MAX_SOURCE_CHARS),
    "extern_c": _repeat('extern "C" ', MAX_SOURCE_CHARS),
    "extern_c_before_the_name": _repeat('extern "C" gemm ', MAX_SOURCE_CHARS),
    "has_include_calls": _repeat("__has_include(", MAX_SOURCE_CHARS),
    "has_include_openers": "#if " + _repeat("__has_include <", MAX_SOURCE_CHARS - 4),
    "pragma_operators": _repeat('_Pragma("unroll") ', MAX_SOURCE_CHARS),
    "splices": _repeat("\\\n", MAX_SOURCE_CHARS),
    "separators": _repeat("1'", MAX_SOURCE_CHARS),
    "escaped_quotes_without_end": _repeat('"\\', MAX_SOURCE_CHARS),
    "directives": _repeat("#line 1\n", MAX_SOURCE_CHARS),
}


def _source_pipeline(source: str) -> None:
    _text_pipeline(source)
    _text_pipeline(f"```cuda\n{source}\n```\n")
    assert not check_policy(source, TASK).ok  # none has the entry point


def test_adversarial_sources_go_through_the_policy_within_budget() -> None:
    assert all(len(source) <= MAX_SOURCE_CHARS for source in ADVERSARIAL_SOURCES.values())
    slow = over_budget(ADVERSARIAL_SOURCES, _source_pipeline)
    assert not slow, slow


# Macros can make the preprocessed source far larger than the candidate: a few hundred bytes of
# nested macros expand to megabytes of adjacent literals.
ADVERSARIAL_PREPROCESSED = {
    "adjacent_literals": _repeat('"a" ', 2_000_000),
    "escaped_quotes_without_end": _repeat('"\\', MAX_SOURCE_CHARS),
    "quotes_around_literals": _repeat('\'"\' "a" ', 2_000_000),
    "quotes": "'" * 1_000_000,
    "raw_string_openers": _repeat('R"', 1_000_000),
}


def test_adversarial_preprocessed_text_is_scanned_within_budget() -> None:
    slow = over_budget(ADVERSARIAL_PREPROCESSED, _assembler_escape)
    assert not slow, slow


def test_preprocessed_text_too_large_to_scan_is_refused_at_once() -> None:
    flood = _repeat('"a" ', 20_000_000)
    verdict: list[str | None] = []
    slow = over_budget({"flood": flood}, lambda text: verdict.append(_assembler_escape(text)))
    assert not slow, slow
    assert verdict[0] is not None and "more than" in verdict[0]
