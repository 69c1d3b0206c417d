"""Safe evaluation of the small integer expressions that task files use.

Task files derive workload axes from sequence lengths (``num_pages: sum(ceil_div(kv_lens,
page_size))``), state constraints (``len_indptr == batch_size + 1``) and count an operator's
floating-point work (``4 * num_qo_heads * head_dim * sum(kv_lens)``). These are data, so they
are parsed with :mod:`ast` and evaluated over a fixed set of operators and functions; nothing in a
task file can run arbitrary Python.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Value = int | bool | list[int]


class ExpressionError(ValueError):
    """An expression is malformed, uses something not allowed, or names an unknown value."""


def _ceil_div(a: Value, b: int) -> Value:
    """``ceil(a / b)`` for an int, or elementwise for a list of ints."""
    if isinstance(a, list):
        return [-(-x // b) for x in a]
    return -(-int(a) // b)


def _dot(a: Sequence[int], b: Sequence[int]) -> int:
    """``sum(a[i] * b[i])`` over two lists of the same length."""
    if len(a) != len(b):
        raise ValueError(f"lists of {len(a)} and {len(b)} elements")
    return sum(x * y for x, y in zip(a, b, strict=True))


def _all_le(a: Sequence[int], b: Sequence[int]) -> bool:
    """True when ``a[i] <= b[i]`` for every i and both have the same length."""
    return len(a) == len(b) and all(x <= y for x, y in zip(a, b, strict=True))


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sum": sum,
    "len": len,
    "max": max,
    "min": min,
    "ceil_div": _ceil_div,
    "all_le": _all_le,
    "dot": _dot,
}
_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}


def evaluate(expression: str, names: Mapping[str, Value]) -> Value:
    """Evaluate ``expression`` over ``names``.

    Allowed: integer literals, names, ``+ - * // %``, comparisons, ``and``/``or``, and the
    functions ``sum len max min ceil_div all_le dot``.
    """
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"cannot parse {expression!r}: {exc.msg}") from None
    value: Value = _eval(tree.body, names, expression)
    return value


def _eval(node: ast.AST, names: Mapping[str, Value], source: str) -> Any:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in names:
            known = ", ".join(sorted(names)) or "none"
            raise ExpressionError(f"{source!r} names {node.id!r}; known names: {known}")
        return names[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](
            _eval(node.left, names, source), _eval(node.right, names, source)
        )
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        left = _eval(node.left, names, source)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = _eval(right_node, names, source)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.BoolOp):
        values = [bool(_eval(v, names, source)) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and not node.keywords
    ):
        args = [_eval(arg, names, source) for arg in node.args]
        try:
            return _FUNCTIONS[node.func.id](*args)
        except (TypeError, ValueError, ZeroDivisionError) as exc:
            raise ExpressionError(f"{source!r}: {node.func.id}(): {exc}") from None
    raise ExpressionError(f"{source!r} uses {ast.unparse(node)!r}, which task files may not use")
