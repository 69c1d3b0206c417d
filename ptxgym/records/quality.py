"""Code-quality metrics of a submission: lines, cyclomatic complexity, maintainability index.

Measured by well-kept libraries, not by our own parser: for CUDA C++, lizard (its C-family
reader gives each function's cyclomatic complexity and, with its Halstead extension, each
function's Halstead volume); for Python candidates (the Triton language), radon. The
maintainability index is the one radon computes for Python (``radon.metrics.mi_compute``: the
SEI formula, 171 − 5.2 ln V − 0.23 G − 16.2 ln L + 50 sin √(2.4 C), rescaled to 0–100), so the
two languages share one scale: for CUDA its inputs are lizard's Halstead volume and complexity
summed over the functions, the source lines of code and the share of comment lines.

The numbers describe the code, not its quality as a kernel: a fast kernel is often long and
branchy. Reports show them beside correctness and speed, never in the reward.
"""

from __future__ import annotations

import tokenize
from dataclasses import asdict, dataclass
from typing import Any

# The action languages whose candidates are Python source (radon reads them); every other
# language's candidate is measured as C++ (lizard).
_PYTHON_LANGUAGES = frozenset({"triton"})


@dataclass(frozen=True)
class CodeQuality:
    """One submission's metrics.

    ``lines``: every line of the source; ``sloc``: lines holding code (no blank or comment-only
    lines); ``comment_lines``: lines holding a comment; ``functions``: functions (kernels,
    device and host functions, Python functions) found; ``cyclomatic_total`` and
    ``cyclomatic_max``: McCabe's complexity summed over the functions, and of the most complex
    one; ``maintainability``: the maintainability index, 0 (hard) to 100 (easy); ``tool``: the
    library that measured it, with its version.
    """

    lines: int
    sloc: int
    comment_lines: int
    functions: int
    cyclomatic_total: int
    cyclomatic_max: int
    maintainability: float
    tool: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure(source: str | None, language: str) -> CodeQuality | None:
    """The metrics of ``source`` written in action ``language``; None without a source (a reply
    with no code block) or when the source cannot be read as that language (Python with a
    syntax error)."""
    if not source:
        return None
    if language in _PYTHON_LANGUAGES:
        return _python(source)
    return _cpp(source)


def _cpp(source: str) -> CodeQuality:
    import lizard
    from lizard_ext.lizardhalstead import LizardExtension as Halstead
    from radon.metrics import mi_compute

    analyzer = lizard.FileAnalyzer(lizard.get_extensions([Halstead()]))
    result = analyzer.analyze_source_code("candidate.cu", source)
    functions = result.function_list
    complexity = [function.cyclomatic_complexity for function in functions]
    volume = sum(float(function.halstead_volume) for function in functions)
    comments = _cpp_comment_lines(source)
    sloc = result.nloc
    return CodeQuality(
        lines=len(source.splitlines()),
        sloc=sloc,
        comment_lines=comments,
        functions=len(functions),
        cyclomatic_total=sum(complexity),
        cyclomatic_max=max(complexity, default=0),
        maintainability=_index(mi_compute, volume, sum(complexity), sloc, comments),
        tool=f"lizard {lizard.version} + radon's maintainability index",
    )


def _cpp_comment_lines(source: str) -> int:
    """Lines that hold a C++ comment, counted from lizard's own tokens (so a ``//`` inside a
    string is not one)."""
    from lizard_languages import CLikeReader

    lines: set[int] = set()
    line = 1
    for token in CLikeReader.generate_tokens(source):
        if token.startswith(("//", "/*")):
            lines.update(range(line, line + token.count("\n") + 1))
        line += token.count("\n")
    return len(lines)


def _python(source: str) -> CodeQuality | None:
    import radon
    from radon.complexity import cc_visit
    from radon.metrics import mi_visit
    from radon.raw import analyze

    try:
        raw = analyze(source)
        blocks = cc_visit(source)
        index = mi_visit(source, multi=True)
    except (SyntaxError, tokenize.TokenError, IndentationError, ValueError):
        return None
    # Methods are inside their classes' blocks; functions and methods are what is counted.
    complexity = [block.complexity for block in blocks if type(block).__name__ == "Function"]
    complexity += [
        method.complexity for block in blocks for method in getattr(block, "methods", [])
    ]
    return CodeQuality(
        lines=len(source.splitlines()),
        sloc=raw.sloc,
        comment_lines=raw.comments,
        functions=len(complexity),
        cyclomatic_total=sum(complexity),
        cyclomatic_max=max(complexity, default=0),
        maintainability=round(float(index), 2),
        tool=f"radon {radon.__version__}",
    )


def _index(formula: Any, volume: float, complexity: int, sloc: int, comments: int) -> float:
    """radon's maintainability index from these inputs; 100 for a source with no code."""
    if sloc <= 0 or volume <= 0:
        return 100.0
    return round(float(formula(volume, complexity, sloc, 100.0 * comments / sloc)), 2)
