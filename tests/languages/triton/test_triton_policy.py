"""The Triton static policy (``ptxgym.languages.triton.policy``): the examples pass, and every
forbidden route (torch doing the work, cuBLAS through torch, modules that reach files, processes
or the interpreter, builtins and dunder tricks, compiler options) is a POLICY_VIOLATION that says
what was forbidden and where, through the env with the compile-only evaluator."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest
import yaml

import ptxgym  # noqa: F401  (registers the tasks)
from ptxgym import paths
from ptxgym.languages.triton.policy import MAX_SOURCE_CHARS, check_policy
from ptxgym.tasks import get_task

GEMM = get_task("PTX-H100-GEMM")
EXAMPLES = paths.examples_dir() / "triton"
KERNEL = """
@triton.jit
def copy_kernel(a_ptr, c_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(c_ptr + offsets, tl.load(a_ptr + offsets, mask=offsets < n), mask=offsets < n)
"""


def module(body: str, *, head: str = "", tail: str = "") -> str:
    """A GEMM-task module: the usual imports and a kernel, ``head`` after the imports, the entry
    with ``body`` (indented by the caller's 4 spaces), then ``tail``."""
    return (
        "import math\nimport torch\nimport triton\nimport triton.language as tl\n"
        f"{head}\n{KERNEL}\n\ndef gemm(A, B, C, M, N, K):\n{body}\n{tail}"
    )


HONEST_BODY = "    copy_kernel[(triton.cdiv(M * N, 1024),)](A, C, M * N, BLOCK=1024)"


def violations(source: str) -> str:
    return "\n".join(check_policy(source, GEMM).violations)


def test_an_honest_module_passes() -> None:
    assert violations(module(HONEST_BODY)) == ""


@pytest.mark.parametrize(
    ("example", "task_id"),
    [
        ("gemm.py", "PTX-H100-GEMM"),
        ("mha_fwd_d128.py", "PTX-H100-MHAFwd-d128"),
        ("gqa_decode.py", "PTX-H100-GQADecode"),
    ],
)
def test_the_examples_pass(example: str, task_id: str) -> None:
    assert check_policy((EXAMPLES / example).read_text(), get_task(task_id)).violations == ()


# (name, module, what the message must say). Each is a way for a module to do the work with
# torch or cuBLAS, or to reach files, processes or the interpreter.
HOSTILE = [
    # torch (and cuBLAS through it) doing the work
    ("torch_matmul", module("    C.copy_(torch.matmul(A, B.T))"), "torch.matmul does the"),
    ("torch_mm", module("    torch.mm(A, B.T, out=C)"), "torch.mm does the"),
    ("matmul_operator", module("    D = A @ B.T"), "the @ operator"),
    ("tensor_method_matmul", module("    D = A.matmul(B)"), "A.matmul: host code may use only"),
    ("einsum", module("    torch.einsum('mk,nk->mn', A, B, out=C)"), "torch.einsum does the"),
    ("aten_op", module("    torch.ops.aten.mm.out(A, B, out=C)"), "torch.ops does the"),
    (
        "sdpa",
        module("    torch.nn.functional.scaled_dot_product_attention(A, B, C)"),
        "torch.nn does the",
    ),
    ("cublas_handle", module("    torch.cuda.current_blas_handle()"), "torch.cuda does the"),
    ("host_arithmetic", module("    D = A * 2"), "the tensor A is used"),
    ("host_slice_write", module("    C[:] = A[:, :N]"), "assigning to C[:] is not allowed"),
    ("host_indexing", module("    x = A[0]"), "indexing the tensor A on the host"),
    ("host_iteration", module("    for row in A:\n        pass"), "the tensor A is used"),
    ("host_copy", module("    C.copy_(A)"), "C.copy_: host code may use only"),
    ("tensor_to_helper", module("    helper(A)", tail="def helper(x):\n    pass\n"), "passed to"),
    (
        "torch_in_helper",
        module(HONEST_BODY, tail="def helper():\n    return torch.empty(4)\n"),
        "torch.empty outside the entry",
    ),
    (
        "torch_in_kernel",
        module(HONEST_BODY, head="@triton.jit\ndef k(x):\n    torch.empty(1)\n"),
        "torch.empty inside a kernel",
    ),
    ("alias_then_compute", module("    X = A\n    Y = X + X"), "the tensor X is used"),
    # modules that reach files, processes, the loader or the interpreter
    ("import_os", module(HONEST_BODY, head="import os"), "import os is not allowed"),
    ("import_subprocess", module(HONEST_BODY, head="import subprocess"), "import subprocess"),
    ("import_ctypes", module(HONEST_BODY, head="import ctypes"), "import ctypes is not allowed"),
    ("import_importlib", module(HONEST_BODY, head="import importlib"), "import importlib"),
    ("import_sys", module(HONEST_BODY, head="import sys"), "import sys is not allowed"),
    ("import_builtins", module(HONEST_BODY, head="import builtins"), "import builtins"),
    ("from_os", module(HONEST_BODY, head="from os import system"), "from os import system"),
    ("torch_alias", module(HONEST_BODY, head="import torch.nn.functional as F"), "import torch.nn"),
    ("import_in_function", module("    import os"), "imports are allowed at module level only"),
    ("star_import", module(HONEST_BODY, head="from triton.language import *"), "is not allowed"),
    # builtins, dunders and introspection
    ("exec", module("    exec('import os')"), "the builtin 'exec' is not allowed"),
    ("eval", module("    eval('1')"), "the builtin 'eval' is not allowed"),
    ("compile", module("    compile('1', 'x', 'eval')"), "the builtin 'compile'"),
    ("dunder_import", module("    __import__('os').system('id')"), "'__import__' is not allowed"),
    ("open", module("    open('/etc/passwd').read()"), "the builtin 'open' is not allowed"),
    ("globals", module("    globals()['os'] = 1"), "the builtin 'globals' is not allowed"),
    ("vars", module("    vars(triton)"), "the builtin 'vars' is not allowed"),
    ("getattr", module("    getattr(torch, 'matmul')(A, B)"), "the builtin 'getattr'"),
    ("builtins_name", module("    __builtins__['open']"), "'__builtins__' is not allowed"),
    (
        "subclasses",
        module("    ().__class__.__bases__[0].__subclasses__()"),
        "attribute '__subclasses__' is not allowed",
    ),
    ("class_attr", module("    t = A.__class__"), "attribute '__class__' is not allowed"),
    ("function_globals", module("    g = gemm.__globals__"), "attribute '__globals__'"),
    ("frame", module("    f = [1].gi_frame"), "'gi_frame' is not allowed"),
    ("generator", module("    g = (x for x in range(3))"), "generator expressions"),
    ("format_escape", module("    s = '{0.__class__}'.format(A)"), "'format' is not allowed"),
    ("builtin_mro", module("    m = int.mro()"), "'mro' is not allowed"),
    ("shadow_builtin", module("    open = 1"), "the name 'open' is a Python builtin's"),
    ("private_name", module("    _x = 1"), "starts with '_'"),
    ("rebind_module", module("    torch = 1"), "imported module's"),
    ("module_as_value", module("    t = triton"), "may be used only as triton.<name>"),
    ("tl_submodule", module(HONEST_BODY, head="B2 = tl.core.builtins"), "tl.core is a submodule"),
    ("tl_deep", module(HONEST_BODY, head="B2 = tl.extra.cuda"), "tl.extra is a submodule"),
    ("dtype_chain", module("    x = torch.float32.is_floating_point"), "only one level below"),
    ("triton_runtime", module("    triton.runtime.driver.active"), "triton.runtime is not"),
    ("triton_knobs", module("    k = triton.knobs"), "triton.knobs is not allowed"),
    ("triton_compile", module("    triton.compile(1)"), "triton.compile is not allowed"),
    ("breakpoint", module("    breakpoint()"), "the builtin 'breakpoint'"),
    # Triton's compiler options and autotuning hooks
    (
        "ir_override",
        module(HONEST_BODY, head="CONFIG = triton.Config({'ir_override': '/etc/passwd'})"),
        "'ir_override' is a compiler option",
    ),
    (
        "extern_libs",
        module("    copy_kernel[(1,)](A, C, 4, BLOCK=4, extern_libs={'x': '/etc/passwd'})"),
        "the launch option 'extern_libs'",
    ),
    (
        "pre_hook",
        module(HONEST_BODY, head="CONFIG = triton.Config({'BLOCK': 64}, pre_hook=print)"),
        "triton.Config(pre_hook=...) is not allowed",
    ),
    (
        "launch_splat",
        module("    copy_kernel[(1,)](A, C, 4, **{'BLOCK': 4})"),
        "**-arguments are not allowed",
    ),
    # statements that hide control flow or write into objects
    ("class", module(HONEST_BODY, tail="class X:\n    pass\n"), "ClassDef at module level"),
    ("try", module("    try:\n        pass\n    except Exception:\n        pass"), "Try"),
    ("with", module("    with A:\n        pass"), "With is not allowed"),
    ("global", module("    global M"), "Global is not allowed"),
    ("attribute_store", module("    C.data = A"), "assigning to C.data"),
    (
        "module_level_call",
        module(HONEST_BODY, tail="X = setup()\ndef setup():\n    return 1\n"),
        "setup() is called at module level",
    ),
    ("module_level_code", module(HONEST_BODY, tail="print('hi')\n"), "Expr at module level"),
    # the entry's contract
    (
        "wrong_signature",
        module(HONEST_BODY).replace("def gemm(A, B, C, M, N, K)", "def gemm(A, B, C)"),
        "exactly def gemm(",
    ),
    ("no_entry", module(HONEST_BODY).replace("def gemm(", "def other("), "is not defined"),
    ("oversized", "#" * (MAX_SOURCE_CHARS + 1), "at most"),
]


@pytest.mark.parametrize(("name", "source", "message"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_each_forbidden_route_is_a_policy_violation_that_says_what_and_where(
    name: str, source: str, message: str
) -> None:
    env = gym.make("PTX-H100-GEMM", language="triton", evaluator="compile-only")
    env.reset()
    info = env.step(f"```python\n{source}\n```")[4]
    env.close()
    assert info["status"] == "POLICY_VIOLATION", name
    assert message in info["message"], info["message"]
    # Where: every violation that concerns the module's text names its line.
    if name not in ("oversized", "no_entry"):
        assert "line " in info["message"], info["message"]


def test_a_name_bound_in_one_function_cannot_make_a_builtin_reachable_in_another() -> None:
    source = module("    return open('/etc/passwd')", tail="def other():\n    open = 1\n")
    found = violations(source)
    assert "the name 'open' is a Python builtin's" in found
    assert "the builtin 'open' is not allowed" in found


def test_host_code_may_read_layouts_allocate_views_and_launch() -> None:
    body = (
        "    scratch = torch.empty((M, N), dtype=torch.float32, device=A.device)\n"
        "    flat = scratch.view(-1)\n"
        "    flat.zero_()\n"
        "    rows, cols = A.shape\n"
        "    stride = A.stride(0) + C.element_size()\n"
        "    grid = lambda meta: (triton.cdiv(rows * cols, meta['BLOCK']),)\n"
        "    triton.set_allocator(lambda size, align, stream: torch.empty(size, device='cuda',"
        " dtype=torch.int8))\n"
        "    copy_kernel[grid](A, flat, rows * cols, BLOCK=math.gcd(stride, 1024) or 1024)\n"
        "    return C"
    )
    assert violations(module(body)) == ""


def test_kernels_may_use_tl_libdevice_and_math() -> None:
    head = (
        "from triton.language.extra import libdevice\n"
        "SCALE = tl.constexpr(0.5)\n"
        "@triton.jit\n"
        "def math_kernel(x_ptr, n, BLOCK: tl.constexpr):\n"
        "    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
        "    x = tl.load(x_ptr + offsets, mask=offsets < n).to(tl.float32)\n"
        "    y = libdevice.exp(x) * SCALE + math.pi\n"
        "    tl.store(x_ptr + offsets, y.to(x_ptr.dtype.element_ty), mask=offsets < n)\n"
    )
    assert violations(module(HONEST_BODY, head=head)) == ""


def test_a_syntax_error_is_left_to_the_build() -> None:
    assert check_policy("def gemm(:\n", GEMM).ok


def test_a_module_too_deep_to_check_is_refused() -> None:
    source = module("    x = " + "(" * 150 + "1" + ")" * 150)
    deep = "x = " + "-" * 100_000 + "1\n"
    assert check_policy(source, GEMM).ok
    assert not check_policy(deep, GEMM).ok


def test_the_examples_are_the_files_the_manifest_lists() -> None:
    entries = yaml.safe_load((paths.examples_dir() / "manifest.yaml").read_text())["examples"]
    listed = {entry["file"] for entry in entries if entry.get("language") == "triton"}
    assert listed == {f"triton/{path.name}" for path in Path(EXAMPLES).glob("*.py")}
