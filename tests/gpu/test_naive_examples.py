"""GPU tests of the plain-CUDA baselines in ``examples/naive``: build, load, compare to references.

Each ``.cu`` file is built with nvcc exactly as the task builds candidates, loaded with ctypes and
called on torch tensors on torch's current stream. Run with
``pytest -m gpu tests/gpu/test_naive_examples.py`` on an sm_90 GPU host.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

pytestmark = pytest.mark.gpu

if TYPE_CHECKING:
    import torch
else:
    torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from kernels_ref import gemm, gqa, mha  # noqa: E402

NAIVE_DIR = Path(__file__).resolve().parents[2] / "examples" / "naive"
NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-shared",
    "-Xcompiler",
    "-fPIC",
    "-gencode",
    "arch=compute_90a,code=sm_90a",
]
CUDA_ERROR_INVALID_VALUE = 1
TOL = 1e-2

MHA_SHAPES = [(2, 256, 3, 128), (1, 200, 2, 128)]


def _nvcc() -> str:
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    candidate = Path(home) / "bin" / "nvcc"
    if candidate.exists():
        return str(candidate)
    pytest.skip("nvcc not found")


def _require_sm90() -> None:
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the naive examples are built for sm_90a")


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ctypes.CDLL]:
    """Build every naive example once; fail on compile errors or warnings."""
    _require_sm90()
    nvcc = _nvcc()
    out_dir = tmp_path_factory.mktemp("naive")
    loaded: dict[str, ctypes.CDLL] = {}
    for name in ("gemm", "mha_fwd_d128", "mha_bwd_d128", "gqa_decode"):
        src = NAIVE_DIR / f"{name}.cu"
        so = out_dir / f"{name}.so"
        proc = subprocess.run(
            [nvcc, *NVCC_FLAGS, "-o", str(so), str(src)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{name}.cu failed to compile:\n{log}"
        assert "warning" not in log.lower(), f"{name}.cu compiled with warnings:\n{log}"
        loaded[name] = ctypes.CDLL(str(so))

    p, i = ctypes.c_void_p, ctypes.c_int
    loaded["gemm"].gemm.argtypes = [p, p, p, i, i, i, p]
    loaded["mha_fwd_d128"].mha_fwd.argtypes = [p, p, p, p, p, i, i, i, i, p]
    loaded["mha_bwd_d128"].mha_bwd.argtypes = [p, p, p, p, p, p, p, p, p, i, i, i, i, p]
    loaded["gqa_decode"].gqa_decode.argtypes = [p, p, p, p, p, p, p, p, i, i, i, p]
    for lib, fn in (
        (loaded["gemm"], "gemm"),
        (loaded["mha_fwd_d128"], "mha_fwd"),
        (loaded["mha_bwd_d128"], "mha_bwd"),
        (loaded["gqa_decode"], "gqa_decode"),
    ):
        getattr(lib, fn).restype = ctypes.c_int
    return loaded


def _stream() -> int:
    return int(torch.cuda.current_stream().cuda_stream)


def _ptr(t: torch.Tensor) -> int:
    return int(t.data_ptr())


def _poisoned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Output buffer full of NaN, so an element the kernel never writes fails the comparison."""
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    """``|a - e| <= TOL * max|e| + TOL * |e|`` elementwise (atol relative to the output scale)."""
    a = actual.double()
    e = expected.double()
    assert a.shape == e.shape, f"{name}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    assert torch.isfinite(a).all(), f"{name}: non-finite values (unwritten or overflowed)"
    bound = TOL * e.abs().max() + TOL * e.abs()
    err = (a - e).abs()
    bad = err > bound
    assert not bad.any(), (
        f"{name}: {int(bad.sum())} elements out of tolerance, max error {err.max().item():.3e} "
        f"(scale {e.abs().max().item():.3e})"
    )


def _snapshot(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in inputs.items()}


def _assert_unchanged(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> None:
    for k in before:
        assert torch.equal(before[k], after[k]), f"input {k} was modified"


@pytest.mark.parametrize(("m", "n", "k"), [(256, 192, 320), (130, 77, 45), (64, 128, 8)])
def test_naive_gemm(libs: dict[str, ctypes.CDLL], m: int, n: int, k: int) -> None:
    x = gemm.make_inputs({"M": m, "N": n, "K": k}, seed=21, device="cuda")
    before = _snapshot(x)
    c = _poisoned((m, n), torch.bfloat16)
    rc = libs["gemm"].gemm(_ptr(x["A"]), _ptr(x["B"]), _ptr(c), m, n, k, _stream())
    torch.cuda.synchronize()
    assert rc == 0
    _assert_close(c, gemm.reference(x)["C"], "C")
    _assert_unchanged(before, x)


@pytest.mark.parametrize("shape", MHA_SHAPES, ids=lambda s: "B{}S{}H{}D{}".format(*s))
def test_naive_mha_fwd(libs: dict[str, ctypes.CDLL], shape: tuple[int, int, int, int]) -> None:
    b, s, h, d = shape
    x = mha.make_fwd_inputs({"B": b, "S": s, "H": h, "D": d}, seed=22, device="cuda")
    before = _snapshot(x)
    o = _poisoned((b, s, h, d), torch.bfloat16)
    lse = _poisoned((b, h, s), torch.float32)
    rc = libs["mha_fwd_d128"].mha_fwd(
        _ptr(x["Q"]), _ptr(x["K"]), _ptr(x["V"]), _ptr(o), _ptr(lse), b, s, h, d, _stream()
    )
    torch.cuda.synchronize()
    assert rc == 0
    ref = mha.fwd_reference(x)
    _assert_close(o, ref["O"], "O")
    _assert_close(lse, ref["LSE"], "LSE")
    _assert_unchanged(before, x)


@pytest.mark.parametrize("shape", MHA_SHAPES, ids=lambda s: "B{}S{}H{}D{}".format(*s))
def test_naive_mha_bwd(libs: dict[str, ctypes.CDLL], shape: tuple[int, int, int, int]) -> None:
    b, s, h, d = shape
    x = mha.make_bwd_inputs({"B": b, "S": s, "H": h, "D": d}, seed=23, device="cuda")
    before = _snapshot(x)
    grads = {n: _poisoned((b, s, h, d), torch.bfloat16) for n in ("dQ", "dK", "dV")}
    rc = libs["mha_bwd_d128"].mha_bwd(
        *(_ptr(x[n]) for n in ("Q", "K", "V", "O", "dO", "LSE")),
        *(_ptr(grads[n]) for n in ("dQ", "dK", "dV")),
        b,
        s,
        h,
        d,
        _stream(),
    )
    torch.cuda.synchronize()
    assert rc == 0
    ref = mha.bwd_reference(x)
    for n in ("dQ", "dK", "dV"):
        _assert_close(grads[n], ref[n], n)
    _assert_unchanged(before, x)


@pytest.mark.parametrize(
    "kv_lens",
    # Whole pages, partial last pages, a single token, and lengths not a multiple of the 8
    # tokens the kernel takes per step.
    [[64, 32], [1, 17, 100, 255], [1031, 7]],
    ids=lambda lens: "-".join(map(str, lens)),
)
def test_naive_gqa_decode(libs: dict[str, ctypes.CDLL], kv_lens: list[int]) -> None:
    pages = sum(-(-n // 16) for n in kv_lens)
    axes = {
        "batch_size": len(kv_lens),
        "len_indptr": len(kv_lens) + 1,
        "num_pages": pages,
        "num_kv_indices": pages,
        "num_qo_heads": 32,
        "num_kv_heads": 8,
        "head_dim": 128,
        "page_size": 16,
    }
    x = gqa.make_decode_inputs(axes, seed=25, device="cuda", kv_lens=kv_lens)
    before = _snapshot(x)
    o = _poisoned((len(kv_lens), 32, 128), torch.bfloat16)
    lse = _poisoned((len(kv_lens), 32), torch.float32)
    names = ("q", "k_cache", "v_cache", "kv_indptr", "kv_indices", "kv_last_page_len")
    rc = libs["gqa_decode"].gqa_decode(
        *(_ptr(x[n]) for n in names), _ptr(o), _ptr(lse), len(kv_lens), pages, pages, _stream()
    )
    torch.cuda.synchronize()
    assert rc == 0
    ref = gqa.decode_reference(x, kv_lens=kv_lens)
    _assert_close(o, ref["o"], "o")
    _assert_close(lse, ref["lse"], "lse")
    _assert_unchanged(before, x)


def test_naive_mha_rejects_other_head_dims(libs: dict[str, ctypes.CDLL]) -> None:
    b, s, h, d = 1, 64, 1, 64
    x = mha.make_bwd_inputs({"B": b, "S": s, "H": h, "D": d}, seed=24, device="cuda")
    out = torch.empty_like(x["Q"])
    lse = torch.empty((b, h, s), dtype=torch.float32, device="cuda")
    rc = libs["mha_fwd_d128"].mha_fwd(
        _ptr(x["Q"]), _ptr(x["K"]), _ptr(x["V"]), _ptr(out), _ptr(lse), b, s, h, d, _stream()
    )
    assert rc == CUDA_ERROR_INVALID_VALUE
    rc = libs["mha_bwd_d128"].mha_bwd(
        *(_ptr(x[n]) for n in ("Q", "K", "V", "O", "dO", "LSE")),
        _ptr(out),
        _ptr(out),
        _ptr(out),
        b,
        s,
        h,
        d,
        _stream(),
    )
    assert rc == CUDA_ERROR_INVALID_VALUE
    torch.cuda.synchronize()
