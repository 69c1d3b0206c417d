"""Static policy: what a Triton candidate module may contain before anything imports it.

The module is read with Python's own parser (``ast``), which is also what will run it: no
spelling can make the check and the interpreter read different programs (identifiers are
NFKC-normalised by the parser, so ``ｏｐｅｎ`` is checked as ``open``). Nothing of the candidate is
executed here. The rules are allow-lists, because a Python module that may name anything can
reach the whole interpreter:

- Imports, at module level only: ``triton``, ``triton.language as tl``, ``torch``, ``math``,
  ``libdevice`` from ``triton.language.extra``, ``TensorDescriptor`` from
  ``triton.tools.tensor_descriptor`` and ``from __future__ import annotations``.
- Names: what the module itself binds, those modules (only as ``module.name``, never as values),
  and a short list of harmless builtins. The module may not bind a builtin's name (a name bound
  in one function could otherwise be a builtin in another), any name starting with ``_``, or an
  imported module's name. So ``exec``, ``eval``, ``open``, ``getattr``, ``globals``,
  ``__import__``, ``__builtins__`` and every other builtin or dunder are unreachable by name.
- Attributes: never one starting with ``_`` (``().__class__.__bases__``), nor the introspection
  attributes of frames, generators and Triton's function objects; one level below a module
  (``tl.load``, not ``tl.core.builtins``), and only these: ``triton.`` jit, autotune, Config,
  heuristics, cdiv, next_power_of_2, set_allocator; ``torch.`` the allocation functions and dtype
  names; any public name of ``tl`` (its submodules excepted), ``libdevice`` and ``math``.
- Host code (every function that is not a ``@triton.jit`` kernel) does no work on tensors: on a
  tensor it may read ``shape``, ``stride()``, ``dtype`` and the like, make views and zero it;
  tensors may be passed only to kernel launches, torch's allocation functions and
  ``TensorDescriptor.from_tensor``; no arithmetic, indexing, iteration or ``@`` on them, and no
  torch function but allocation (no ``torch.matmul``, ``F.scaled_dot_product_attention``, cuBLAS
  by any route). torch may be called only in the entry function (and lambdas inside it), so
  tensors never leave it.
- Kernels (``@triton.jit``, optionally under ``@triton.autotune`` and ``@triton.heuristics``)
  use ``tl``, ``libdevice``, ``math``, their own names and other kernels; no torch.
- Compiler options that name files or toolchain flags (``ir_override``, ``extern_libs``,
  ``ptx_options`` …) may not be passed to a launch or a ``triton.Config``; autotuning hooks and
  custom benchmarkers are refused (their results could not be cached ahead of the evaluation).
- Statements: no classes, ``try``, ``with``, ``global``, ``del``, ``async``, generators or
  assignments to attributes or items; module level holds only imports, functions and constants.
- The entry function is defined at module level with exactly the task's parameters.

A module Python cannot parse passes this check and fails the build (``build``), which reports
the syntax error. docs/security.md says what this policy cannot see.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ptxgym.languages.base import PolicyReport
from ptxgym.tasks import Task

MAX_SOURCE_CHARS = 200_000
"""Longest accepted module (the example FlashAttention kernel is about 6k characters)."""
_MAX_VIOLATIONS = 20

# What may be imported, as written: the statement's form and the name it binds.
_IMPORTS = {
    ("import", "triton", None): "triton",
    ("import", "triton.language", "tl"): "tl",
    ("import", "torch", None): "torch",
    ("import", "math", None): "math",
    ("from", "triton.language.extra", "libdevice"): "libdevice",
    ("from", "triton.tools.tensor_descriptor", "TensorDescriptor"): "TensorDescriptor",
}
ALLOWED_IMPORTS = (
    "import triton",
    "import triton.language as tl",
    "import torch",
    "import math",
    "from triton.language.extra import libdevice",
    "from triton.tools.tensor_descriptor import TensorDescriptor",
)
MODULES = frozenset(_IMPORTS.values())

# fmt: off
TRITON_FUNCTIONS = frozenset({
    "jit", "autotune", "Config", "heuristics", "cdiv", "next_power_of_2", "set_allocator"
})
# fmt: on
TORCH_FUNCTIONS = frozenset({"empty", "empty_like", "zeros", "zeros_like", "full"})
"""What the entry may call of torch: allocation, and memsets that do none of the operator's
work (they count in its timing)."""
# fmt: off
_DTYPES = frozenset({
    "bfloat16", "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
    "bool", "float8_e4m3fn", "float8_e5m2"
})
# fmt: on
# torch names that do the operator's work: named in the message, so the model knows why.
# fmt: off
_TORCH_WORK = frozenset({
    "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "softmax", "nn", "ops", "linalg",
    "tensordot", "dot", "mv", "cuda", "backends", "compile", "library"
})
# fmt: on
# Public names of triton.language that are submodules (3.6): reaching into them opens the rest
# of Triton (tl.core imports the interpreter's builtins).
# fmt: off
_TL_SUBMODULES = frozenset({
    "core", "extra", "math", "random", "standard", "target_info", "semantic"
})
# fmt: on
# tl names that may be used as values (not called): dtypes, and constexpr for annotations.
_TL_VALUES = _DTYPES | {"float8e4nv", "float8e5", "float8e4b15", "uint16", "uint32", "uint64"}
_TL_VALUES |= {"constexpr", "tensor"}
# fmt: off
TENSOR_ATTRIBUTES = frozenset({
    "shape", "stride", "size", "numel", "dtype", "device", "element_size", "dim", "ndim",
    "is_contiguous", "view", "zero_"
})
# fmt: on
"""What host code may read or call on a tensor: its layout, views and zeroing, nothing that
computes."""
# fmt: off
ALLOWED_BUILTINS = frozenset({
    "range", "len", "min", "max", "abs", "int", "float", "bool", "tuple", "list", "dict", "zip",
    "enumerate", "sorted", "reversed", "any", "all", "sum", "round", "divmod", "pow", "print",
    "ValueError", "RuntimeError", "NotImplementedError", "AssertionError"
})
# fmt: on
_BUILTIN_NAMES = frozenset(dir(builtins))
# Attributes through which Python code reaches frames, globals or code objects, or Triton's
# function objects reach their module: refused wherever they appear.
# fmt: off
_INTROSPECTION = frozenset({
    "mro", "gi_frame", "gi_code", "cr_frame", "cr_code", "ag_frame", "ag_code", "f_globals",
    "f_locals", "f_builtins", "f_back", "f_code", "tb_frame", "tb_next", "func_globals",
    "format", "format_map", "get_capture_scope", "fn", "src", "device_caches", "cache_key",
    "run", "warmup", "preload"
})
# fmt: on
# Compiler options a launch or a Config could set: each names a file to read, flags for ptxas,
# or the target; none is the candidate's to choose.
# fmt: off
COMPILER_OPTIONS = frozenset({
    "ir_override", "extern_libs", "ptx_options", "arch", "ptx_version", "instrumentation_mode",
    "backend_name"
})
# fmt: on
_JIT_OPTIONS = frozenset(
    {"do_not_specialize", "do_not_specialize_on_alignment", "debug", "noinline"}
)
_AUTOTUNE_OPTIONS = frozenset(
    {"configs", "key", "reset_to_zero", "restore_value", "prune_configs_by", "cache_results"}
)
_CONFIG_OPTIONS = frozenset({"num_warps", "num_stages", "num_ctas", "maxnreg"})
_KERNEL_DECORATORS = ("autotune", "heuristics")
_ANNOTATION_NAMES = frozenset({"int", "float", "bool", "str"})


@dataclass(frozen=True)
class _Scope:
    """Where an expression is: in a kernel, in the entry (where torch may be called), the
    tensors known there, the function's name (for messages), and whether it runs when the
    module is imported (module level, outside lambdas)."""

    jit: bool
    entry: bool
    tensors: frozenset[str]
    where: str
    at_import: bool = False


_MODULE_SCOPE = _Scope(
    jit=False, entry=False, tensors=frozenset(), where="module level", at_import=True
)


def entry_parameters(task: Task) -> list[str]:
    """The entry function's parameters, in order: inputs, outputs, then the integer axes."""
    definition = task.definition
    return [*definition.inputs, *definition.outputs, *task.entry_point.axes]


def check_policy(source: str, task: Task) -> PolicyReport:
    """Every rule the module breaks (empty: it may be built)."""
    if len(source) > MAX_SOURCE_CHARS:
        return PolicyReport(
            (f"the module is {len(source):,} characters; at most {MAX_SOURCE_CHARS:,} allowed",)
        )
    try:
        tree = ast.parse(source, filename="candidate.py")
    except (SyntaxError, ValueError):
        return PolicyReport(())  # the build reports it, with the line: nothing can run it
    except (RecursionError, MemoryError):
        # Python itself may still compile what its AST cannot hold: refused, never unchecked.
        return PolicyReport(("the module is nested too deeply to be checked",))
    try:
        violations = _Checker(tree, task).violations()
    except RecursionError:
        violations = ["the module is nested too deeply to be checked"]
    unique = list(dict.fromkeys(violations))
    if len(unique) > _MAX_VIOLATIONS:
        unique = [*unique[:_MAX_VIOLATIONS], f"... and {len(unique) - _MAX_VIOLATIONS} more"]
    return PolicyReport(tuple(unique))


def _where(node: ast.AST) -> str:
    return f"line {getattr(node, 'lineno', '?')}"


def _dotted(node: ast.expr) -> str:
    """An expression as the model wrote it, short (for messages)."""
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."


def _decorator_name(node: ast.expr) -> str | None:
    """``jit`` for ``@triton.jit`` or ``@triton.jit(...)``, likewise autotune and heuristics."""
    target = node.func if isinstance(node, ast.Call) else node
    if (
        isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id == "triton"
    ):
        return target.attr
    return None


class _Checker:
    """One pass over a parsed module, collecting every rule it breaks."""

    def __init__(self, tree: ast.Module, task: Task) -> None:
        self.tree = tree
        self.task = task
        self.entry = task.entry_point.symbol
        self.found: list[str] = []
        self.kernels = {
            node.name
            for node in tree.body
            if isinstance(node, ast.FunctionDef)
            and any(_decorator_name(d) == "jit" for d in node.decorator_list)
        }
        self.functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        self.bound = self._bindings()

    def violations(self) -> list[str]:
        for statement in self.tree.body:
            self._module_statement(statement)
        self._entry_defined()
        return self.found

    def _violation(self, node: ast.AST, message: str) -> None:
        self.found.append(f"{_where(node)}: {message}")

    # ------------------------------------------------------------------------------------------
    # Names the module binds.

    def _bindings(self) -> set[str]:
        """Every name the module binds, each checked (no builtins, modules or underscores), and
        no module-level function bound twice."""
        bound: set[str] = set()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                name = node.id
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = node.name
            elif isinstance(node, ast.arg):
                name = node.arg
            else:
                continue
            self._binding_allowed(name, node)
            bound.add(name)
        module_level: list[str] = []
        for statement in self.tree.body:
            if isinstance(statement, ast.FunctionDef):
                module_level.append(statement.name)
            elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
                targets = (
                    statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                )
                module_level += [
                    name.id
                    for target in targets
                    for name in ast.walk(target)
                    if isinstance(name, ast.Name)
                ]
        for name in sorted(self.functions):
            if module_level.count(name) > 1:
                self.found.append(
                    f"the function {name!r} is bound more than once at module level: give each "
                    "function and constant a name of its own"
                )
        return bound

    def _binding_allowed(self, name: str, node: ast.AST) -> None:
        if name.startswith("_"):
            self._violation(node, f"the name {name!r} starts with '_', which is not allowed")
        elif name in MODULES:
            self._violation(node, f"the name {name!r} is an imported module's; it may not be bound")
        elif name in _BUILTIN_NAMES:
            self._violation(
                node, f"the name {name!r} is a Python builtin's; bind another name instead"
            )

    # ------------------------------------------------------------------------------------------
    # Module level.

    def _module_statement(self, node: ast.stmt) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            self._import(node)
        elif isinstance(node, ast.FunctionDef):
            self._function(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            self._statement(node, _MODULE_SCOPE)
        elif (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            pass  # a docstring
        else:
            self._violation(
                node,
                f"{type(node).__name__} at module level: the module may hold only imports, "
                "functions and constants",
            )

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__" and node.level == 0:
            if [alias.name for alias in node.names] != ["annotations"]:
                self._violation(node, "only 'from __future__ import annotations' is allowed")
            return
        for alias in node.names:
            if isinstance(node, ast.Import):
                key = ("import", alias.name, alias.asname)
                written = f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
            else:
                module = "." * node.level + (node.module or "")
                key = ("from", module, alias.name if alias.asname is None else "")
                written = f"from {module} import {alias.name}" + (
                    f" as {alias.asname}" if alias.asname else ""
                )
            if key not in _IMPORTS:
                self._violation(
                    node,
                    f"{written} is not allowed: the module may import only "
                    + "; ".join(ALLOWED_IMPORTS),
                )

    def _function(self, node: ast.FunctionDef) -> None:
        decorators = [_decorator_name(d) for d in node.decorator_list]
        jit = node.name in self.kernels
        if jit:
            self._kernel_decorators(node, decorators)
        elif node.decorator_list:
            self._violation(
                node,
                f"the function {node.name!r} has a decorator other than @triton.jit "
                "(with @triton.autotune or @triton.heuristics above it)",
            )
        if node.name == self.entry:
            if jit:
                self._violation(node, f"the entry {self.entry!r} must be a plain Python function")
            self._entry_signature(node)
        arguments = node.args
        if arguments.vararg or arguments.kwarg or arguments.kwonlyargs or arguments.posonlyargs:
            self._violation(
                node, f"{node.name!r}: only plain parameters (no *args, **kwargs, / or *)"
            )
        for argument in arguments.args:
            if argument.annotation is not None:
                self._annotation(argument.annotation)
            if jit and argument.arg in COMPILER_OPTIONS:
                self._violation(
                    argument, f"the kernel parameter {argument.arg!r} names a compiler option"
                )
        if node.returns is not None:
            self._annotation(node.returns)
        for default in arguments.defaults:
            self._expression(default, _MODULE_SCOPE)
        tensors = self._entry_tensors(node) if node.name == self.entry else frozenset()
        scope = _Scope(jit=jit, entry=node.name == self.entry, tensors=tensors, where=node.name)
        for statement in node.body:
            self._statement(statement, scope)

    def _kernel_decorators(self, node: ast.FunctionDef, names: list[str | None]) -> None:
        """``@triton.jit`` innermost, only autotune and heuristics above it, each once."""
        *outer, innermost = names
        if innermost != "jit" or names.count("jit") != 1:
            self._violation(
                node, f"the kernel {node.name!r}: @triton.jit must be its innermost decorator"
            )
        for name in outer:
            if name not in _KERNEL_DECORATORS:
                self._violation(
                    node,
                    f"the kernel {node.name!r}: only @triton.autotune and @triton.heuristics may "
                    "decorate a @triton.jit function",
                )
        for decorator in node.decorator_list:
            if isinstance(decorator, ast.Call):
                self._call(decorator, _MODULE_SCOPE)

    def _annotation(self, node: ast.expr) -> None:
        """Annotations run when the function is defined: only plain types."""
        if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, str)):
            return
        if isinstance(node, ast.Name) and node.id in _ANNOTATION_NAMES:
            return
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and (node.value.id, node.attr)
            in {("tl", "constexpr"), ("tl", "tensor"), ("torch", "Tensor")}
        ):
            return
        self._violation(
            node,
            f"the annotation {_dotted(node)} is not allowed (use int, float, bool, "
            "tl.constexpr, tl.tensor or torch.Tensor)",
        )

    def _entry_signature(self, node: ast.FunctionDef) -> None:
        expected = entry_parameters(self.task)
        names = [argument.arg for argument in node.args.args]
        if names != expected or node.args.defaults:
            self._violation(
                node,
                f"the entry must be exactly def {self.entry}({', '.join(expected)}) (no "
                f"defaults); it is def {self.entry}({', '.join(names)})",
            )

    def _entry_defined(self) -> None:
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == self.entry:
                return
        self.found.append(
            f"the entry function def {self.entry}({', '.join(entry_parameters(self.task))}) is "
            "not defined at module level"
        )

    def _entry_tensors(self, node: ast.FunctionDef) -> frozenset[str]:
        """The entry's tensors: its input and output parameters and every name bound to one, a
        torch allocation or a view of a tensor (flow-insensitively: bound once, a tensor
        everywhere)."""
        definition = self.task.definition
        tensors = set(definition.inputs) | set(definition.outputs)
        changed = True
        while changed:
            changed = False
            for statement in ast.walk(node):
                if not isinstance(statement, (ast.Assign, ast.AnnAssign)):
                    continue
                targets = (
                    statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                )
                if statement.value is None or not self._makes_tensor(statement.value, tensors):
                    continue
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name) and name.id not in tensors:
                            tensors.add(name.id)
                            changed = True
        return frozenset(tensors)

    def _makes_tensor(self, node: ast.expr, tensors: set[str]) -> bool:
        if isinstance(node, ast.Name):
            return node.id in tensors
        if isinstance(node, ast.IfExp):
            return self._makes_tensor(node.body, tensors) or self._makes_tensor(
                node.orelse, tensors
            )
        if isinstance(node, (ast.Tuple, ast.List)):
            return any(self._makes_tensor(element, tensors) for element in node.elts)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            base, attribute = node.func.value, node.func.attr
            if isinstance(base, ast.Name) and base.id == "torch":
                return attribute in TORCH_FUNCTIONS
            return attribute in ("view", "zero_") and self._makes_tensor(base, tensors)
        return False

    # ------------------------------------------------------------------------------------------
    # Statements in functions (and the constants at module level).

    def _statement(self, node: ast.stmt, scope: _Scope) -> None:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                self._target(target)
            self._value(node.value, scope)
        elif isinstance(node, ast.AnnAssign):
            self._target(node.target)
            self._annotation(node.annotation)
            if node.value is not None:
                self._value(node.value, scope)
        elif isinstance(node, ast.AugAssign):
            self._target(node.target)
            if isinstance(node.target, ast.Name) and node.target.id in scope.tensors:
                self._violation(
                    node,
                    f"{node.target.id} is a tensor: host code may not compute with tensors "
                    "(do the work in a Triton kernel)",
                )
            self._expression(node.value, scope)
        elif isinstance(node, ast.Expr):
            self._expression(node.value, scope)
        elif isinstance(node, ast.Return):
            if node.value is None or (
                scope.entry and isinstance(node.value, ast.Name) and node.value.id in scope.tensors
            ):
                return  # the entry's return value is ignored
            self._expression(node.value, scope)
        elif isinstance(node, (ast.If, ast.While)):
            self._expression(node.test, scope)
            self._body([*node.body, *node.orelse], scope)
        elif isinstance(node, ast.For):
            self._target(node.target)
            self._expression(node.iter, scope)
            self._body([*node.body, *node.orelse], scope)
        elif isinstance(node, ast.Assert):
            self._expression(node.test, scope)
            if node.msg is not None:
                self._expression(node.msg, scope)
        elif isinstance(node, ast.Raise) and not scope.jit and node.cause is None:
            if node.exc is not None:
                self._expression(node.exc, scope)
        elif isinstance(node, (ast.Pass, ast.Break, ast.Continue)):
            pass
        elif isinstance(node, ast.FunctionDef):
            self._violation(
                node, f"the function {node.name!r} is nested: define it at module level"
            )
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            self._violation(node, "imports are allowed at module level only")
        else:
            self._violation(
                node, f"the statement {type(node).__name__} is not allowed ({scope.where})"
            )

    def _body(self, statements: Iterable[ast.stmt], scope: _Scope) -> None:
        for statement in statements:
            self._statement(statement, scope)

    def _target(self, node: ast.expr) -> None:
        """What may be assigned to: names, and tuples or lists of them (never an attribute or
        an item: that would write into an object, a tensor's memory among them)."""
        if isinstance(node, ast.Name):
            return
        if isinstance(node, (ast.Tuple, ast.List)):
            for element in node.elts:
                self._target(element.value if isinstance(element, ast.Starred) else element)
            return
        self._violation(
            node,
            f"assigning to {_dotted(node)} is not allowed: assign to names only (kernels write "
            "the outputs)",
        )
        if isinstance(node, (ast.Subscript, ast.Attribute)) and not (
            isinstance(node.value, ast.Name) and node.value.id in self.bound
        ):
            self._expression(node.value, _MODULE_SCOPE)  # what is written into, named too

    def _value(self, node: ast.expr, scope: _Scope) -> None:
        """The right-hand side of an assignment: a tensor may be bound to another name."""
        if isinstance(node, ast.Name) and node.id in scope.tensors:
            return
        self._expression(node, scope)

    # ------------------------------------------------------------------------------------------
    # Expressions.

    def _expression(self, node: ast.expr, scope: _Scope) -> None:
        if isinstance(node, ast.Constant):
            return
        if isinstance(node, ast.Name):
            self._name(node, scope)
        elif isinstance(node, ast.Attribute):
            self._attribute(node, scope, called=False)
        elif isinstance(node, ast.Call):
            self._call(node, scope)
        elif isinstance(node, ast.Subscript):
            if isinstance(node.value, ast.Name) and node.value.id in scope.tensors:
                self._violation(
                    node,
                    f"indexing the tensor {node.value.id} on the host is not allowed: index it in "
                    "a Triton kernel",
                )
            else:
                self._expression(node.value, scope)
            self._expression(node.slice, scope)
        elif isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.MatMult) and not scope.jit:
                self._violation(
                    node,
                    "the @ operator is a torch (cuBLAS) matrix product on the host: compute the "
                    "product in a Triton kernel with tl.dot",
                )
            self._expression(node.left, scope)
            self._expression(node.right, scope)
        elif isinstance(node, ast.Lambda):
            if scope.jit:
                self._violation(node, "lambdas are not allowed inside a kernel")
            for default in node.args.defaults:
                self._expression(default, scope)
            # Its body runs when it is called (a grid, a heuristic), not at import.
            self._expression(node.body, replace(scope, at_import=False))
        elif isinstance(node, ast.GeneratorExp):
            self._violation(node, "generator expressions are not allowed (use a list)")
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp)):
            if scope.jit:
                self._violation(node, "comprehensions are not allowed inside a kernel")
            for generator in node.generators:
                self._target(generator.target)
                if generator.is_async:
                    self._violation(node, "async comprehensions are not allowed")
            self._children(node, scope)
        elif isinstance(node, (ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)):
            self._violation(node, f"{type(node).__name__} is not allowed")
        elif isinstance(
            node,
            (
                ast.UnaryOp,
                ast.BoolOp,
                ast.Compare,
                ast.IfExp,
                ast.Tuple,
                ast.List,
                ast.Set,
                ast.Dict,
                ast.Slice,
                ast.Starred,
                ast.JoinedStr,
                ast.FormattedValue,
            ),
        ):
            self._children(node, scope)
        else:
            self._violation(node, f"the expression {type(node).__name__} is not allowed")

    def _children(self, node: ast.AST, scope: _Scope) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self._expression(child, scope)
            elif isinstance(child, ast.comprehension):
                self._expression(child.iter, scope)
                for condition in child.ifs:
                    self._expression(condition, scope)

    def _name(self, node: ast.Name, scope: _Scope) -> None:
        """A name read anywhere but as a module's base, a call's function or a launch."""
        name = node.id
        if name in MODULES:
            self._violation(
                node, f"the module {name} may be used only as {name}.<name>, not as a value"
            )
        elif name in scope.tensors:
            self._violation(
                node,
                f"the tensor {name} is used in {scope.where} other than by reading its layout "
                "or passing it to a kernel launch, torch's allocation or "
                "TensorDescriptor.from_tensor: host code may not compute with tensors",
            )
        elif name in self.kernels and not scope.jit:
            self._violation(
                node, f"the kernel {name} may be used only as {name}[grid](...), not as a value"
            )
        elif name in ALLOWED_BUILTINS or (name in self.bound and name not in _BUILTIN_NAMES):
            return
        elif name.startswith("__"):
            self._violation(node, f"the name {name!r} is not allowed (names starting with __)")
        elif name in _BUILTIN_NAMES:
            self._violation(
                node,
                f"the builtin {name!r} is not allowed (allowed builtins: "
                f"{', '.join(sorted(ALLOWED_BUILTINS))})",
            )
        else:
            self._violation(node, f"the name {name!r} is not defined by the module")

    def _attribute(self, node: ast.Attribute, scope: _Scope, *, called: bool) -> None:
        """An attribute read (``called``: as a call's function). Each problem is reported where
        it starts: the chain ``a.b.c`` is checked from its root out."""
        links = [node]
        root = node.value
        while isinstance(root, ast.Attribute):
            links.append(root)
            root = root.value
        links.reverse()  # links[0] is the attribute taken of the root
        for link in links:
            if link.attr.startswith("_"):
                self._violation(
                    link, f"the attribute {link.attr!r} is not allowed (it starts with '_')"
                )
                return
            if link.attr in _INTROSPECTION:
                self._violation(link, f"the attribute {link.attr!r} is not allowed")
                return
        if isinstance(root, ast.Name) and root.id in MODULES:
            before = len(self.found)
            self._module_attribute(links[0], root.id, scope, called=called and len(links) == 1)
            if len(links) > 1 and len(self.found) == before:
                self._violation(
                    node,
                    f"{_dotted(node)}: only one level below a module may be used "
                    f"({root.id}.<name>)",
                )
            return
        base = node.value
        if isinstance(base, ast.Constant):
            self._violation(node, f"attributes of literals are not allowed ({_dotted(node)})")
            return
        if isinstance(base, ast.Name) and base.id in ALLOWED_BUILTINS:
            self._violation(node, f"attributes of builtins are not allowed ({_dotted(node)})")
            return
        tensor = isinstance(base, ast.Name) and base.id in scope.tensors
        before = len(self.found)
        if not tensor:
            self._expression(base, scope)
        if not scope.jit and node.attr not in TENSOR_ATTRIBUTES and len(self.found) == before:
            self._violation(
                node,
                f"{_dotted(node)}: host code may use only these attributes of an object: "
                f"{', '.join(sorted(TENSOR_ATTRIBUTES))}",
            )

    def _module_attribute(
        self, node: ast.Attribute, module: str, scope: _Scope, *, called: bool
    ) -> None:
        attribute = node.attr
        if module == "torch":
            if scope.jit:
                self._violation(node, f"torch.{attribute} inside a kernel: kernels use tl only")
            elif attribute in _DTYPES:
                return
            elif attribute in _TORCH_WORK:
                self._violation(
                    node,
                    f"torch.{attribute} does the operator's work in torch (cuBLAS/cuDNN): write "
                    "it as a Triton kernel",
                )
            elif attribute not in TORCH_FUNCTIONS or not called:
                self._violation(
                    node,
                    f"torch.{attribute} is not allowed: host code may use only torch."
                    f"{', torch.'.join(sorted(TORCH_FUNCTIONS))} and torch dtypes",
                )
            elif not scope.entry:
                self._violation(
                    node,
                    f"torch.{attribute} outside the entry function: allocate in "
                    f"{self.entry}() (or a lambda inside it)",
                )
        elif module == "triton":
            if attribute not in TRITON_FUNCTIONS:
                self._violation(
                    node,
                    f"triton.{attribute} is not allowed (allowed: triton."
                    f"{', triton.'.join(sorted(TRITON_FUNCTIONS))})",
                )
            elif not called:
                self._violation(node, f"triton.{attribute} may only be called (or decorate)")
        elif module == "tl":
            if attribute in _TL_SUBMODULES:
                self._violation(
                    node, f"tl.{attribute} is a submodule; use the names tl itself exports"
                )
            elif not called and attribute not in _TL_VALUES:
                self._violation(
                    node,
                    f"tl.{attribute} may only be called (only dtypes and tl.constexpr are values)",
                )
        elif module == "TensorDescriptor":
            if attribute != "from_tensor" or not called:
                self._violation(node, "only TensorDescriptor.from_tensor(...) may be used")
        elif module == "libdevice" and not called:
            self._violation(node, f"libdevice.{attribute} may only be called")

    # ------------------------------------------------------------------------------------------
    # Calls.

    def _call(self, node: ast.Call, scope: _Scope) -> None:
        function = node.func
        kind = self._callee(function, scope)
        for argument in node.args:
            value = argument.value if isinstance(argument, ast.Starred) else argument
            self._argument(value, kind, node, scope)
        for keyword in node.keywords:
            if keyword.arg is None:
                if kind in ("launch", "triton"):
                    self._violation(
                        node, f"**-arguments are not allowed in {_dotted(function)}(...)"
                    )
                self._expression(keyword.value, scope)
                continue
            if kind == "launch" and keyword.arg in COMPILER_OPTIONS:
                self._violation(
                    keyword, f"the launch option {keyword.arg!r} is not the candidate's to set"
                )
            self._argument(keyword.value, kind, node, scope)
        if kind == "triton":
            assert isinstance(function, ast.Attribute)
            self._triton_call(node, function.attr)

    def _callee(self, function: ast.expr, scope: _Scope) -> str:
        """What kind of function a call calls, its callee checked: ``launch`` (a kernel),
        ``torch``, ``triton``, ``descriptor`` (TensorDescriptor.from_tensor), ``method``,
        ``function`` (a name) or ``other``."""
        if isinstance(function, ast.Subscript):
            if isinstance(function.value, ast.Name) and function.value.id in self.kernels:
                if scope.jit:
                    self._violation(function, "kernels cannot launch kernels")
                elif scope.at_import:
                    self._violation(function, "kernels may not be launched at module level")
                self._expression(function.slice, scope)
                return "launch"
            before = len(self.found)
            self._expression(function, scope)
            if len(self.found) == before:
                self._violation(
                    function,
                    f"{_dotted(function)}(...): only kernels are launched as kernel[grid](...)",
                )
            return "other"
        if isinstance(function, ast.Attribute):
            self._attribute(function, scope, called=True)
            base = function.value
            if isinstance(base, ast.Name) and base.id in ("torch", "triton"):
                return base.id
            if isinstance(base, ast.Name) and base.id == "TensorDescriptor":
                return "descriptor"
            return "method"
        if isinstance(function, ast.Name):
            name = function.id
            if name in self.kernels:
                if not scope.jit:
                    self._violation(
                        function,
                        f"the kernel {name} is called directly: launch it as {name}[grid](...)",
                    )
                return "function"
            if name in scope.tensors:
                self._violation(function, f"the tensor {name} is called")
                return "other"
            if name in self.functions and scope.at_import:
                # Importing the module must run none of its code (tool runs import it before
                # they hold the GPU).
                self._violation(
                    function,
                    f"{name}() is called at module level: module level holds only constants",
                )
                return "function"
            if name in ALLOWED_BUILTINS or (name in self.bound and name not in _BUILTIN_NAMES):
                return "function"
            self._name(function, scope)
            return "other"
        before = len(self.found)
        self._expression(function, scope)
        if len(self.found) == before:
            self._violation(
                function, f"{_dotted(function)}(...): only named functions may be called"
            )
        return "other"

    def _argument(self, node: ast.expr, kind: str, call: ast.Call, scope: _Scope) -> None:
        """A call's argument: a tensor only to a launch, torch's allocation or a descriptor."""
        if isinstance(node, ast.Name) and node.id in scope.tensors:
            if kind not in ("launch", "torch", "descriptor"):
                self._violation(
                    node,
                    f"the tensor {node.id} is passed to {_dotted(call.func)}: tensors may be "
                    "passed only to kernel launches, torch's allocation functions and "
                    "TensorDescriptor.from_tensor",
                )
            return
        self._expression(node, scope)

    def _triton_call(self, node: ast.Call, function: str) -> None:
        """The options of triton's own calls: nothing that runs code the cache cannot hold,
        names a file, or sets the toolchain."""
        allowed = {
            "jit": _JIT_OPTIONS,
            "autotune": _AUTOTUNE_OPTIONS,
            "Config": _CONFIG_OPTIONS,
        }.get(function)
        if allowed is not None:
            for keyword in node.keywords:
                if keyword.arg is not None and keyword.arg not in allowed:
                    self._violation(
                        keyword,
                        f"triton.{function}({keyword.arg}=...) is not allowed (allowed: "
                        f"{', '.join(sorted(allowed))})",
                    )
        if function in ("Config", "heuristics"):
            for argument in node.args[:1]:
                for key in _dict_keys(argument):
                    if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                        self._violation(argument, f"triton.{function}'s keys must be strings")
                    elif key.value in COMPILER_OPTIONS:
                        self._violation(
                            key, f"{key.value!r} is a compiler option, not the candidate's to set"
                        )


def _dict_keys(node: ast.expr) -> Sequence[ast.expr | None]:
    return node.keys if isinstance(node, ast.Dict) else []
