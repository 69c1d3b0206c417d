"""C++ source text → preprocessing tokens, read the way gcc reads a translation unit.

Every static scan of a candidate (``ptxgym.languages.cuda.policy``) and of its preprocessed source
(``ptxgym.languages.cuda.compiler``) looks at tokens from this module, never at raw text, so a
comment, a literal or a line splice cannot hide a directive from a scan while the compiler sees it.
nvcc preprocesses both the host and the device side with the host gcc, so gcc (libcpp, in the
``-std=c++17`` mode of every build) is the reference for translation phases 1 to 3:

1. ``\\r\\n`` and a lone ``\\r`` end a line like ``\\n``. Trigraphs are *not* replaced: C++17
   removed them, and gcc and nvcc's front end both ignore them in that mode.
2. A backslash, then any spaces, tabs, form feeds or vertical tabs, then a line end is removed
   (a line splice), in one pass.
3. The spliced text is cut into preprocessing tokens: comments become whitespace; identifiers
   (``$`` included, as gcc allows); pp-numbers with digit separators (quotes followed by a
   letter, digit or ``_``) and exponent signs (not right after a separator and a letter);
   character and string literals with the ``u8``, ``u``, ``U`` and ``L`` prefixes and
   user-defined suffixes, an unterminated one running to the end of its line; raw strings with
   any prefix; header-names right after ``#include``, ``#include_next``, ``#import``,
   ``#embed`` and ``__has_include``/``__has_include_next``; punctuators, digraphs included,
   longest first (with C++11's ``<::`` exception); and any other single character.

Each token records whether it starts a logical line (a newline inside a comment does not end
one) and whether it belongs to a directive's line. Where gcc's reading cannot be reproduced
with certainty (an unterminated comment or literal, an invalid or unterminated raw string, a
line splice inside a raw string, a stray backslash, a universal character name or a non-ASCII
character outside literals and comments, a NUL), a :class:`Problem` is recorded and lexing
goes on; a scan that must not guess refuses the text. Every step is linear in the text's length:
a token consumes what was examined to find it, and the searches past a token (a raw string's
line end, a header-name's ``>``) are cached.
"""

from __future__ import annotations

import bisect
import enum
import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple


class Kind(enum.Enum):
    """What a preprocessing token is."""

    IDENTIFIER = "identifier"
    NUMBER = "number"
    CHARACTER = "character literal"
    STRING = "string literal"
    HEADER_NAME = "header name"
    PUNCTUATOR = "punctuator"
    OTHER = "other character"


class Token(NamedTuple):
    """One preprocessing token."""

    kind: Kind
    text: str
    """The spelling after line splicing (a raw string as written, less any splice)."""
    line: int
    """The physical source line (1-based) the token starts on."""
    starts_line: bool
    """First token of a logical line: a ``#`` here begins a directive."""
    spaced: bool
    """Whitespace or a comment comes right before it."""
    directive: bool
    """Part of a directive's line (the ``#`` included)."""


class Problem(NamedTuple):
    """A place where the text cannot be tokenised the way gcc would, for certain."""

    line: int
    what: str


@dataclass(frozen=True)
class Lexed:
    """The tokens of a text and the problems met while cutting it."""

    tokens: tuple[Token, ...]
    problems: tuple[Problem, ...]


@dataclass(frozen=True)
class StringRun:
    """Adjacent string literals, as the compiler joins them (translation phase 6)."""

    text: str
    """The joined value, escape sequences decoded."""
    line: int
    delimited_escape: bool
    """An escape ``\\o{…}``, ``\\x{…}``, ``\\u{…}`` or ``\\N{…}`` occurs: gcc 13 and later decode
    it, gcc 12 reads it as an unknown escape, so its value depends on the host compiler."""


# A backslash, horizontal whitespace gcc accepts, and a line end (or the end of the text, where
# gcc supplies the missing newline).
_SPLICE_RE = re.compile(r"\\[ \t\f\v]*(?:\n|\Z)")
_UCN = r"\\u[0-9A-Fa-f]{4}|\\U[0-9A-Fa-f]{8}"
_PREFIX = r"(?:u8|[uUL])?"
_SUFFIX = r"(?:[A-Za-z_][A-Za-z0-9_]*)?"
# Whitespace and a line comment, then one alternative per token class, tried at the current
# position. Nothing backtracks: each repetition's alternatives start with different characters,
# and an unterminated comment or literal consumes what was examined.
_TOKEN_RE = re.compile(
    r"(?P<space>[ \t\f\v]*(?://[^\n]*)?)"
    r"(?:(?P<newline>\n)"
    r"|(?P<block_comment>/\*(?:[^*]|\*(?!/))*(?P<comment_end>\*/)?)"
    rf"|(?P<raw>{_PREFIX}R\")"
    rf"|(?P<string>{_PREFIX}\"(?:[^\"\\\n]|\\.)*(?P<string_end>\"{_SUFFIX})?)"
    rf"|(?P<character>{_PREFIX}'(?:[^'\\\n]|\\.)*(?P<character_end>'{_SUFFIX})?)"
    rf"|(?P<number>\.?[0-9](?:[eEpP][+-]|'+[A-Za-z0-9_]|[A-Za-z0-9_.$]|{_UCN}|[^\x00-\x7f])*)"
    rf"|(?P<identifier>(?:[A-Za-z_$]|{_UCN}|[^\x00-\x7f])(?:[A-Za-z0-9_$]|{_UCN}|[^\x00-\x7f])*)"
    r"|(?P<punctuator><(?=::(?![:>]))|%:%:|\.\.\.|<<=|>>=|->\*"
    r"|##|%:|<:|:>|<%|%>|::|\.\*|->|\+\+|--|<<|>>|<=|>=|==|!=|&&|\|\||[-*/%+&|^]="
    r"|[-{}\[\]#()<>%:;.?*+/^&|~!=,])"
    r"|(?P<other>[^\n]))?",
)
# In a header-name position gcc reads <...> and "..." without escape sequences. Whether a '<'
# opens a header-name (a '>' before the line's end) is decided with the lexer's cached search.
_HEADER_RE = re.compile(
    r"[ \t\f\v]*(?:(?P<angled><)"
    rf"|(?P<quoted>(?P<prefix>{_PREFIX})\"[^\"\n]*(?P<quoted_end>\")?))"
)
# A raw string's delimiter: at most 16 of the basic source characters other than space,
# parentheses and backslash, then the opening parenthesis.
_RAW_DELIMITER_RE = re.compile(r"[A-Za-z0-9_{}\[\]#<>%:;.?*+\-/^&|~!=,\"']{0,16}\(")
_RAW_SUFFIX_RE = re.compile(_SUFFIX)
_INCLUDE_DIRECTIVES = frozenset({"include", "include_next", "import", "embed"})
_HAS_INCLUDE = frozenset({"__has_include", "__has_include_next"})
_HASHES = frozenset({"#", "%:"})
# Token kinds where a backslash (a universal character name) or a non-ASCII character is a problem.
_CHECKED_CHARACTERS = frozenset({Kind.IDENTIFIER, Kind.NUMBER, Kind.OTHER})


def _splice(source: str) -> tuple[str, list[int]]:
    """Phases 1 and 2: the text with line ends made ``\\n`` and line splices removed, and the
    offsets (in that text) where a splice was removed, in order."""
    text = source.replace("\r\n", "\n").replace("\r", "\n")
    if "\\" not in text:
        return text, []
    pieces: list[str] = []
    splices: list[int] = []
    kept, position = 0, 0
    for match in _SPLICE_RE.finditer(text):
        pieces.append(text[position : match.start()])
        kept += match.start() - position
        splices.append(kept)
        position = match.end()
    pieces.append(text[position:])
    return "".join(pieces), splices


def tokenise(source: str) -> Lexed:
    """Cut ``source`` into preprocessing tokens as gcc does (see the module's docstring)."""
    lexer = Lexer(source)
    tokens = tuple(lexer.tokens())
    return Lexed(tokens, tuple(lexer.problems))


class Lexer:
    """Tokenises one text lazily, for texts too large to hold as tokens (a preprocessed source):
    iterate :meth:`tokens` once; :attr:`problems` fills as it goes."""

    def __init__(self, source: str) -> None:
        self.text, self.splices = _splice(source)
        self.problems: list[Problem] = []
        self.next_found: dict[str, int] = {}

    def next_index(self, character: str, position: int) -> int:
        """Where ``character`` next occurs at or after ``position`` (the text's length if it does
        not). Searches are cached and positions only grow, so each stretch of text is searched
        once, however many tokens ask (a line of many raw strings or ``__has_include <``)."""
        found = self.next_found.get(character, -1)
        if found < position:
            found = self.text.find(character, position)
            self.next_found[character] = found = len(self.text) if found < 0 else found
        return found

    def tokens(self) -> Iterator[Token]:
        """The tokens, in order."""
        # The loop runs once per token of texts of megabytes (preprocessed sources): it keeps to
        # local variables, and counts lines as it goes.
        text, length, splices = self.text, len(self.text), self.splices
        problems = self.problems
        if (nul := text.find("\0")) >= 0:
            line = text.count("\n", 0, nul) + bisect.bisect_right(splices, nul) + 1
            problems.append(Problem(line, "a NUL character"))
        # A NamedTuple made without its Python-level __new__: a third of the time per token.
        new_token = tuple.__new__
        identifier, punctuator = Kind.IDENTIFIER, Kind.PUNCTUATOR
        position, newlines, splices_passed = 0, 0, 0
        starts_line, spaced, directive, naming_directive = True, False, False, False
        # Header-name lexing: 0 off; 1 for the next token; 2 for the next token and, when that is
        # '(', for the one after it too (__has_include).
        header_mode = 0
        while position < length:
            found = _HEADER_RE.match(text, position) if header_mode else None
            if found is not None and found.lastgroup == "angled":
                closing = self.next_index(">", found.start("angled"))
                if closing < self.next_index("\n", found.start("angled")):
                    header_end = closing + 1
                else:  # no '>' on the line: an ordinary '<'
                    found = None
            if found is None:
                found = _TOKEN_RE.match(text, position)
                assert found is not None  # every part is optional
            group = found.lastgroup
            if group is None or group == "space":  # only whitespace is left
                break
            start, end = found.start(group), found.end()
            if group == "angled":
                end = header_end
            spaced = spaced or start > position
            if splices:
                while splices_passed < len(splices) and splices[splices_passed] <= start:
                    splices_passed += 1
            line = newlines + splices_passed + 1
            if group == "newline":
                newlines += 1
                if directive:  # the directive ends here, and any header-name position with it
                    header_mode = 0
                starts_line, spaced, directive, naming_directive = True, False, False, False
                position = end
                continue
            if group == "block_comment":
                if found.group("comment_end") is None:
                    problems.append(Problem(line, "an unterminated comment"))
                newlines += text.count("\n", start, end)
                spaced, position = True, end
                continue
            if group == "identifier":
                kind = identifier
            elif group == "punctuator":
                kind = punctuator
            elif group == "number":
                kind = Kind.NUMBER
            elif group == "string":
                kind = Kind.STRING
                if found.group("string_end") is None:
                    problems.append(Problem(line, "an unterminated string literal"))
            elif group == "raw":
                kind, end = Kind.STRING, self.raw_string(start, end, line, directive)
                newlines += text.count("\n", start, end)  # for the tokens after it
            elif group == "character":
                kind = Kind.CHARACTER
                if found.group("character_end") is None:
                    problems.append(Problem(line, "an unterminated character literal"))
            elif group == "angled":
                kind = Kind.HEADER_NAME
            elif group == "quoted":
                kind = Kind.STRING if found.group("prefix") else Kind.HEADER_NAME
                if found.group("quoted_end") is None:
                    problems.append(Problem(line, "an unterminated header name"))
            else:
                kind = Kind.OTHER
            spelling = text[start:end]
            if (not spelling.isascii() or "\\" in spelling) and kind in _CHECKED_CHARACTERS:
                problems.append(Problem(line, _character_problem(kind, spelling)))
            opens_directive = starts_line and kind is punctuator and spelling in _HASHES
            directive = directive or opens_directive
            yield new_token(Token, (kind, spelling, line, starts_line, spaced, directive))
            if header_mode:
                header_mode = 1 if header_mode == 2 and spelling == "(" else 0
            if kind is identifier:
                if spelling in _HAS_INCLUDE:
                    header_mode = 2
                elif naming_directive and spelling in _INCLUDE_DIRECTIVES:
                    header_mode = 1
            starts_line, spaced, naming_directive = False, False, opens_directive
            position = end

    def raw_string(self, start: int, delimiter_start: int, line: int, directive: bool) -> int:
        """Lex a raw string whose ``R"`` ends at ``delimiter_start``; return where it ends.

        In a directive the string cannot run past the line's end (gcc stops there)."""
        text = self.text
        limit = self.next_index("\n", start) if directive else len(text)
        opening = _RAW_DELIMITER_RE.match(text, delimiter_start, limit)
        if opening is None:
            self.problems.append(Problem(line, "an invalid raw string delimiter"))
            return limit
        delimiter = text[delimiter_start : opening.end() - 1]
        close = text.find(f'){delimiter}"', opening.end(), limit)
        if close < 0:
            self.problems.append(Problem(line, "an unterminated raw string"))
            return limit
        suffix = _RAW_SUFFIX_RE.match(text, close + len(delimiter) + 2)
        assert suffix is not None  # the suffix is optional
        inside = bisect.bisect_right(self.splices, start)
        if inside < len(self.splices) and self.splices[inside] < suffix.end():
            # gcc puts the splice back inside a raw string, which changes where it ends.
            self.problems.append(Problem(line, "a line continuation inside a raw string"))
        return suffix.end()


def _character_problem(kind: Kind, spelling: str) -> str:
    if kind is Kind.OTHER and spelling == "\\":
        return "a stray backslash"
    return f"a universal character name or non-ASCII character outside literals ({spelling[:40]!r})"


def directive_lines(tokens: Sequence[Token]) -> list[tuple[Token, Sequence[Token]]]:
    """Each directive as (its ``#`` or ``%:`` token, the tokens after it on its line)."""
    lines: list[tuple[Token, Sequence[Token]]] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if token.starts_line and token.directive:
            first = index
            while index < len(tokens) and not tokens[index].starts_line:
                index += 1
            lines.append((token, tokens[first:index]))
    return lines


def code_text(tokens: Iterable[Token]) -> str:
    """The tokens as text, one space where whitespace or a comment was, a newline before each
    logical line: the source as the compiler sees it after phase 3."""
    return "".join(
        ("\n" if token.starts_line else " " if token.spaced else "") + token.text
        for token in tokens
    )


def string_runs(tokens: Iterable[Token]) -> Iterator[StringRun]:
    """Every run of adjacent string literals, joined and decoded.

    Outside directives, a run goes on across directive lines (the preprocessor removes them
    before literals are joined); inside a directive, a run ends with its line."""
    code: list[Token] = []
    directive: list[Token] = []
    for token in tokens:
        if token.starts_line and directive:
            yield _joined(directive)
            directive.clear()
        run = directive if token.directive else code
        if token.kind is Kind.STRING:
            run.append(token)
        elif run:
            yield _joined(run)
            run.clear()
    for run in (code, directive):
        if run:
            yield _joined(run)


def _joined(run: list[Token]) -> StringRun:
    values = [literal_value(token) for token in run]
    return StringRun(
        "".join(value for value, _ in values),
        run[0].line,
        any(delimited for _, delimited in values),
    )


_LITERAL_PARTS_RE = re.compile(r"(?P<prefix>(?:u8|[uUL])?R?)(?P<quote>[\"'])")
_ESCAPE_RE = re.compile(
    r"\\(?:(?P<octal>[0-7]{1,3})"
    r"|(?P<delimited>[oxu])\{(?P<delimited_digits>[^}\n]*)\}"
    r"|N\{(?P<name>[^}\n]*)\}"
    r"|x(?P<hex>[0-9A-Fa-f]+)"
    r"|u(?P<u4>[0-9A-Fa-f]{4})"
    r"|U(?P<u8>[0-9A-Fa-f]{8})"
    r"|(?P<simple>.))",
    re.DOTALL,
)
_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n"}
_SIMPLE_ESCAPES |= {"r": "\r", "t": "\t", "v": "\v"}


def literal_value(token: Token) -> tuple[str, bool]:
    """A string or character literal's value (escapes decoded; a raw string's characters as
    written), and whether it holds a delimited or named escape (see :class:`StringRun`)."""
    if token.text[0] == '"' and "\\" not in token.text:  # most literals: no prefix, no escape
        closing = token.text.rfind('"')
        return token.text[1 : closing if closing > 0 else len(token.text)], False
    parts = _LITERAL_PARTS_RE.match(token.text)
    assert parts is not None, token
    quote = parts.group("quote")
    body_start = parts.end()
    body_end = token.text.rfind(quote)
    if body_end < body_start:  # unterminated: the value runs to the end of the token
        body_end = len(token.text)
    body = token.text[body_start:body_end]
    if parts.group("prefix").endswith("R"):
        opening = body.find("(")
        closing = body.rfind(")")
        return (body[opening + 1 : closing] if 0 <= opening < closing else body), False
    delimited = False

    def decode(escape: re.Match[str]) -> str:
        nonlocal delimited
        if (simple := escape.group("simple")) is not None:
            return _SIMPLE_ESCAPES.get(simple, simple)
        if (name := escape.group("name")) is not None:
            delimited = True
            try:
                return unicodedata.lookup(name)
            except KeyError:
                return escape.group()
        if (digits := escape.group("delimited_digits")) is not None:
            delimited = True
            base = 8 if escape.group("delimited") == "o" else 16
            try:
                return _character(int(digits, base))
            except ValueError:
                return escape.group()
        for group, base in (("octal", 8), ("hex", 16), ("u4", 16), ("u8", 16)):
            if (digits := escape.group(group)) is not None:
                return _character(int(digits, base))
        raise AssertionError(escape.group())

    return _ESCAPE_RE.sub(decode, body), delimited


def _character(value: int) -> str:
    return chr(value) if value < 0x110000 else "\ufffd"
