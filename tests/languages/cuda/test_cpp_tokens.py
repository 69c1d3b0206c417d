"""The C++ tokeniser against gcc: splices, line ends, trigraphs, comments, literals, numbers.

Where gcc is installed, each tricky input is also run through ``g++ -std=c++17 -E`` (the mode
nvcc preprocesses in) and the two readings are compared: which directives define a macro, and
whether an identifier is left in code (gcc expands it) or hidden in a comment or literal.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from ptxgym.languages.cuda.cpp_tokens import (
    Kind,
    Token,
    code_text,
    directive_lines,
    literal_value,
    string_runs,
    tokenise,
)

GXX = shutil.which("g++")
needs_gxx = pytest.mark.skipif(GXX is None, reason="g++ is not installed")


def tokens_of(source: str) -> tuple[Token, ...]:
    lexed = tokenise(source)
    assert not lexed.problems, lexed.problems
    return lexed.tokens


def spellings(source: str) -> list[tuple[Kind, str]]:
    return [(token.kind, token.text) for token in tokens_of(source)]


def defined_directives(source: str) -> set[str]:
    """Names of the ``#define`` directives the tokeniser finds."""
    return {
        line[1].text
        for _, line in directive_lines(tokenise(source).tokens)
        if len(line) > 1 and line[0].text == "define"
    }


def identifier_in_code(source: str, name: str) -> bool:
    return any(
        token.kind is Kind.IDENTIFIER and token.text == name and not token.directive
        for token in tokenise(source).tokens
    )


def gcc_preprocess(source: str, *options: str) -> str:
    assert GXX is not None
    done = subprocess.run(
        [GXX, "-std=c++17", "-E", "-P", *options, "-x", "c++", "-"],
        input=source.encode("utf-8"),
        capture_output=True,
        check=False,
        timeout=60,
    )
    return done.stdout.decode("utf-8", "replace")


def gcc_defines(source: str, name: str) -> bool:
    """Whether gcc ran a ``#define name`` of ``source``."""
    return f"#define {name} " in gcc_preprocess(source, "-dM")


def gcc_sees_in_code(source: str, name: str) -> bool:
    """Whether gcc expanded ``name`` (defined on the command line) where it occurs in code."""
    return "GCC_SAW_IT" in gcc_preprocess(source, f"-D{name}=GCC_SAW_IT")


# ------------------------------------------------------------------------------------------
# Phases 1 and 2: line ends and line splices

SPLICE_SPACES = ["", " ", "\t", "\f", "\v", " \t\f\v "]
LINE_ENDS = ["\n", "\r\n", "\r"]


@pytest.mark.parametrize("line_end", LINE_ENDS, ids=repr)
@pytest.mark.parametrize("spaces", SPLICE_SPACES, ids=repr)
def test_a_backslash_horizontal_space_and_line_end_splice_lines(spaces: str, line_end: str) -> None:
    source = f"#def\\{spaces}{line_end}ine SPLICED 1{line_end}int x;{line_end}"
    assert defined_directives(source) == {"SPLICED"}
    if GXX:
        assert gcc_defines(source, "SPLICED")


@pytest.mark.parametrize("line_end", LINE_ENDS, ids=repr)
def test_every_line_end_ends_a_line(line_end: str) -> None:
    source = f"int x;{line_end}#define AFTER 1{line_end}"
    assert defined_directives(source) == {"AFTER"}
    assert [token.line for token in tokens_of(source)] == [1, 1, 1, 2, 2, 2, 2]
    if GXX:
        assert gcc_defines(source, "AFTER")


def test_a_splice_is_one_pass_and_lines_are_counted_through_it() -> None:
    # "\\\\\n\n": the second backslash splices the first line end; the first backslash is then
    # followed by the second line end, which it does not splice (gcc makes one pass).
    lexed = tokenise("a \\\\\n\nb")
    assert [(token.text, token.line) for token in lexed.tokens] == [("a", 1), ("\\", 1), ("b", 3)]
    assert [problem.what for problem in lexed.problems] == ["a stray backslash"]


@needs_gxx
def test_trigraphs_are_not_replaced_as_in_gcc_cxx17() -> None:
    source = '??=define TRIGRAPH 1\nconst char* s = "??/";\nint VISIBLE;\n'
    assert defined_directives(source) == set()
    assert not gcc_defines(source, "TRIGRAPH")
    # "??/" is not a backslash, so the literal ends and what follows is code.
    assert identifier_in_code(source, "VISIBLE")
    assert gcc_sees_in_code(source, "VISIBLE")


# ------------------------------------------------------------------------------------------
# Directives: where a logical line starts

DIRECTIVE_PLACES = [
    ("#define D 1\n", True),
    ("  \t\f\v#  define D 1\n", True),
    ("%:define D 1\n", True),
    ("/* c */ #define D 1\n", True),
    ("/* a\n b */ #define D 1\n", True),  # the line starts before the comment
    ("# /* a\n b */ define D 1\n", True),  # a comment inside a directive keeps it going
    ("int a; /* a\n b */ #define D 1\n", False),  # a newline inside a comment is no line end
    ("int a; #define D 1\n", False),
    ("%:%:define D 1\n", False),  # %:%: is ##, not #
    ('const char* s = "\n#define D 1\n";\n', True),  # an unterminated literal ends at the line
    ('const char* s = R"(\n#define D 1\n)";\n', False),
    ("// c \\\n#define D 1\n", False),  # the splice continues the comment
    ("/\\\n* c */ #define D 1\n", True),
    ("??=define D 1\n", False),
]


@pytest.mark.parametrize(("source", "is_directive"), DIRECTIVE_PLACES, ids=repr)
def test_directives_start_logical_lines_as_in_gcc(source: str, is_directive: bool) -> None:
    assert ("D" in defined_directives(source)) is is_directive
    if GXX:
        assert gcc_defines(source, "D") is is_directive


def test_tokens_know_their_line_start_and_directive() -> None:
    tokens = tokens_of("int a;\n  # include <x>\nb")
    assert [(token.text, token.starts_line, token.directive) for token in tokens] == [
        ("int", True, False),
        ("a", False, False),
        (";", False, False),
        ("#", True, True),
        ("include", False, True),
        ("<x>", False, True),
        ("b", True, False),
    ]


# ------------------------------------------------------------------------------------------
# pp-numbers and digit separators

NUMBERS = [
    ("1'000", "1'000"),
    ("1'000'000", "1'000'000"),
    ("0x1'ff", "0x1'ff"),
    ("0b1'0", "0b1'0"),
    ("0'7", "0'7"),
    ("1'2ull", "1'2ull"),
    ("1.0'5f", "1.0'5f"),
    ("1.'5", "1.'5"),
    (".5'5", ".5'5"),
    ("1e'5", "1e'5"),
    ("1'e+5", "1'e"),  # no sign after a separator and a letter: 1'e is not "pp-number e"
    ("1''2", "1''2"),  # adjacent separators: gcc takes them, then refuses the number
    ("1'''a", "1'''a"),
    ("1e+5", "1e+5"),
    ("0x1p-3", "0x1p-3"),
    ("1'_a", "1'_a"),
    ("1$'5", "1$'5"),
    ("1..2", "1..2"),
]


@pytest.mark.parametrize(("source", "number"), NUMBERS, ids=repr)
def test_pp_numbers_take_digit_separators_and_signs(source: str, number: str) -> None:
    tokens = tokens_of(f"x = {source} + VISIBLE;")
    assert (tokens[2].kind, tokens[2].text) == (Kind.NUMBER, number)
    assert tokens[3].text == "+"


# A quote that cannot be a digit separator (not followed by a letter, digit or _) starts a
# character literal, which here runs to the end of the line and hides VISIBLE.
SEPARATOR_BOUNDARIES = [
    ("1'000 + VISIBLE;", True),
    ("0x1'f' + VISIBLE;", False),
    ("1'.5 + VISIBLE;", False),
    ("1'$a + VISIBLE;", False),
    ("1p'+5 + VISIBLE;", False),
    ("1'+'a + VISIBLE;", True),
    ("1'+' + VISIBLE;", True),
    ("1'2 + '/*'; VISIBLE;", True),
    ("1e+VISIBLE;", False),
    ("1'e+VISIBLE;", True),
    ("1'''a + VISIBLE;", True),
    ("1''''a' + VISIBLE;", False),
    ("1'''+' + VISIBLE;", True),
    ("1''+' + VISIBLE;", False),
]


@pytest.mark.parametrize(("source", "visible"), SEPARATOR_BOUNDARIES, ids=repr)
def test_digit_separator_boundaries_match_gcc(source: str, visible: bool) -> None:
    assert identifier_in_code(source, "VISIBLE") is visible
    if GXX:
        assert gcc_sees_in_code(source, "VISIBLE") is visible


# ------------------------------------------------------------------------------------------
# Literals

LITERALS = [
    ("'\"'", Kind.CHARACTER),
    ("'\\''", Kind.CHARACTER),
    ("u8'x'", Kind.CHARACTER),
    ("L'\"'", Kind.CHARACTER),
    ("'ab'", Kind.CHARACTER),
    ('"a\\"b"', Kind.STRING),
    ('u8"x"', Kind.STRING),
    ('u"x"', Kind.STRING),
    ('U"x"', Kind.STRING),
    ('L"x"', Kind.STRING),
    ('"x"_suffix', Kind.STRING),
    ('R"(a " b)"', Kind.STRING),
    ('R"x(a )" b)x"', Kind.STRING),
    ('u8R"(a\nb)"', Kind.STRING),
    ('LR"--(/* ")--"', Kind.STRING),
    ('uR"(x)"', Kind.STRING),
    ('UR"(x)"_s', Kind.STRING),
    ('R""(a)")""', Kind.STRING),
]


@pytest.mark.parametrize(("literal", "kind"), LITERALS, ids=repr)
def test_literals_are_one_token_and_hide_nothing_after_them(literal: str, kind: Kind) -> None:
    source = f"x = {literal} ; VISIBLE;\n"
    tokens = tokens_of(source)
    assert (tokens[2].kind, tokens[2].text) == (kind, literal)
    assert identifier_in_code(source, "VISIBLE")
    if GXX:
        assert gcc_sees_in_code(source, "VISIBLE")


@pytest.mark.parametrize(
    "source",
    ['fooR"x" VISIBLE', 'U8"x" VISIBLE', "R'x' VISIBLE", 'u8 "x" VISIBLE'],
    ids=repr,
)
def test_only_exact_prefixes_make_prefixed_literals(source: str) -> None:
    tokens = tokens_of(source)
    assert tokens[0].kind is Kind.IDENTIFIER
    assert tokens[-1].text == "VISIBLE"
    if GXX:
        assert gcc_sees_in_code(source, "VISIBLE")


def test_header_names_follow_include_directives_and_has_include() -> None:
    assert spellings("#include <a'b/*c>\n")[-1] == (Kind.HEADER_NAME, "<a'b/*c>")
    assert spellings('#include "a\\"\n')[-1] == (Kind.HEADER_NAME, '"a\\"')
    assert spellings("%:import <x>\n")[-1] == (Kind.HEADER_NAME, "<x>")
    assert spellings("#if __has_include ( <x'> )\n#endif\n")[4] == (Kind.HEADER_NAME, "<x'>")
    # Elsewhere < is a punctuator and "..." a string with escapes.
    assert spellings("#define X <x>\n")[3] == (Kind.PUNCTUATOR, "<")
    assert spellings('#error "a\\"b"\n')[-1] == (Kind.STRING, '"a\\"b"')


def test_punctuators_take_the_longest_match_with_the_cxx11_exception() -> None:
    texts = [text for _, text in spellings("a<::b> c<:::> d<::> %:%: ... ->* <<= >>= .* <% %>")]
    assert texts == [
        *["a", "<", "::", "b", ">", "c", "<:", "::", ">", "d", "<:", ":>"],
        *["%:%:", "...", "->*", "<<=", ">>=", ".*", "<%", "%>"],
    ]


# ------------------------------------------------------------------------------------------
# What cannot be read for certain

PROBLEMS = [
    ("/* never closed", "an unterminated comment"),
    ("x = 'a;", "an unterminated character literal"),
    ('x = "a;', "an unterminated string literal"),
    ('x = R"(a;', "an unterminated raw string"),
    ('x = R"a b(x)a b";', "an invalid raw string delimiter"),
    ('x = R"$(x)$";', "an invalid raw string delimiter"),
    ('x = R"12345678901234567(x)12345678901234567";', "an invalid raw string delimiter"),
    ('x = R"a\n(x)a";', "an invalid raw string delimiter"),
    ('x = R"(a\\\nb)";', "a line continuation inside a raw string"),
    ('#define S R"(\n)"\n', "an unterminated raw string"),
    ("x = a \\ b;", "a stray backslash"),
    ("int \\u0041b;", "a universal character name or non-ASCII character"),
    ("int caf\u00e9;", "a universal character name or non-ASCII character"),
    ("int x = 1\u00a0;", "a universal character name or non-ASCII character"),
    ("int x;\0", "a NUL character"),
    ('#include "never closed\n', "an unterminated header name"),
]


@pytest.mark.parametrize(("source", "problem"), PROBLEMS, ids=repr)
def test_what_gcc_may_read_otherwise_is_a_problem(source: str, problem: str) -> None:
    problems = tokenise(source).problems
    assert problems, "expected a problem"
    assert problem in problems[0].what


def test_problems_carry_the_physical_line() -> None:
    lexed = tokenise("a\\\nb\nc\r\nd = 'x;\n")
    assert [(problem.line, problem.what) for problem in lexed.problems] == [
        (4, "an unterminated character literal")
    ]


def test_literals_and_comments_may_hold_any_character() -> None:
    assert tokens_of("// caf\u00e9 \\u0041\n/* \u00d7 */ s = \"\u00e9\\u0041\"; c = '\u00e9';")


# ------------------------------------------------------------------------------------------
# Joined and decoded string literals


def runs(source: str) -> list[str]:
    return [run.text for run in string_runs(tokens_of(source))]


def test_adjacent_literals_are_joined_across_comments_lines_and_directives() -> None:
    assert runs('asm(".inc" /* c */ "bin");') == [".incbin"]
    assert runs('asm(".in"\n  u8"cl" // c\n "ude");') == [".include"]
    assert sorted(runs('asm(".inc"\n#define X "y"\n"bin");')) == [".incbin", "y"]
    assert runs('a(".inc", "bin"); b(\'"\' ".x" "y");') == [".inc", "bin", ".xy"]


def test_raw_strings_and_suffixes_join_by_value() -> None:
    assert runs('x = R"d(.in)d" "c\\154ude"_s;') == [".include"]


@pytest.mark.parametrize(
    ("literal", "value"),
    [
        ('"\\x2eincbin"', ".incbin"),
        ('"\\056incbin"', ".incbin"),
        ('"\\u002eincbin"', ".incbin"),
        ('"\\U0000002eincbin"', ".incbin"),
        ('"\\.incbin"', ".incbin"),
        ('"a\\\\b\\"c\\n"', 'a\\b"c\n'),
        ('"\\e\\a\\?"', "\x1b\a?"),
        ('R"(\\x2e)"', "\\x2e"),
        ("'\\x41'", "A"),
    ],
    ids=repr,
)
def test_escapes_are_decoded(literal: str, value: str) -> None:
    (token,) = tokens_of(literal)
    assert literal_value(token) == (value, False)


@pytest.mark.parametrize(
    ("literal", "value"),
    [('"\\x{2e}"', "."), ('"\\o{56}"', "."), ('"\\u{2e}"', "."), ('"\\N{FULL STOP}"', ".")],
    ids=repr,
)
def test_delimited_and_named_escapes_are_decoded_and_flagged(literal: str, value: str) -> None:
    (token,) = tokens_of(literal)
    assert literal_value(token) == (value, True)
    (run,) = string_runs((token,))
    assert run.delimited_escape


def test_code_text_keeps_adjacency_and_drops_comments() -> None:
    assert code_text(tokens_of("a/**/b  .incbin\n# x //c\n c10::at")) == (
        "\na b .incbin\n# x\nc10::at"
    )
