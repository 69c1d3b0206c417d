"""GPU tests of ``kernels_ref``: references vs independent math, baselines vs references, inputs.

Run on a GPU host with ``pytest -m gpu tests/gpu/test_kernels_ref.py``. Shapes are small; the
GQA baseline tests skip when FlashInfer is not installed.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import pytest

pytestmark = pytest.mark.gpu

if TYPE_CHECKING:
    import torch
else:
    torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from kernels_ref import gemm, gqa, mha  # noqa: E402

DEV = "cuda"
HAS_FLASHINFER = importlib.util.find_spec("flashinfer") is not None
needs_flashinfer = pytest.mark.skipif(not HAS_FLASHINFER, reason="flashinfer is not installed")

MHA_AXES = [
    {"B": 2, "S": 128, "H": 3, "D": 64},
    {"B": 1, "S": 200, "H": 2, "D": 128},
]
DECODE_KV_LENS = [1, 15, 16, 17, 100, 333]
PREFILL_Q_LENS = [1, 17, 64, 40]
PREFILL_KV_LENS = [1, 40, 64, 300]


def _assert_close(
    actual: torch.Tensor, expected: torch.Tensor, *, tol: float, name: str = ""
) -> None:
    """Elementwise ``|a - e| <= tol * (max|e| + |e|)``: atol and rtol of ``tol``, scale-aware."""
    a = actual.double()
    e = expected.double()
    assert a.shape == e.shape, f"{name}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    assert torch.isfinite(a).all(), f"{name}: non-finite values"
    scale = e.abs().max().clamp_min(1e-12)
    bound = tol * (scale + e.abs())
    err = (a - e).abs()
    worst = (err / bound).max().item()
    assert worst <= 1.0, (
        f"{name}: max error {err.max().item():.3e} exceeds tol {tol} (x{worst:.2f})"
    )


def _assert_baseline_close(
    got: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor], names: list[str]
) -> None:
    for n in names:
        torch.testing.assert_close(got[n].float(), ref[n].float(), atol=2e-2, rtol=2e-2, msg=n)


# --------------------------------------------------------------------------------------------
# GEMM
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("m", "n", "k"), [(64, 48, 80), (131, 67, 45)])
def test_gemm_reference_matches_fp64(m: int, n: int, k: int) -> None:
    x = gemm.make_inputs({"M": m, "N": n, "K": k}, seed=0, device=DEV)
    assert x["A"].dtype == torch.bfloat16 and x["A"].shape == (m, k)
    assert x["B"].dtype == torch.bfloat16 and x["B"].shape == (n, k)
    ref = gemm.reference(x)["C"]
    assert ref.dtype == torch.float32 and ref.shape == (m, n)
    exact = x["A"].double() @ x["B"].double().T
    _assert_close(ref, exact, tol=1e-5, name="C")


def test_gemm_cublas_matches_reference() -> None:
    x = gemm.make_inputs({"M": 256, "N": 192, "K": 320}, seed=1, device=DEV)
    run = gemm.cublas(x)
    out = run()
    assert out["C"].dtype == torch.bfloat16
    ref = gemm.reference(x)
    # Relative to the output scale: entries are sums of 320 products, std ~18.
    scale = ref["C"].abs().max().item()
    torch.testing.assert_close(out["C"].float(), ref["C"], atol=2e-2 * scale, rtol=2e-2)
    # A second call reuses the preallocated output.
    assert run()["C"].data_ptr() == out["C"].data_ptr()


# --------------------------------------------------------------------------------------------
# MHA
# --------------------------------------------------------------------------------------------


def _dense_lse(q: torch.Tensor, k: torch.Tensor, causal: bool) -> torch.Tensor:
    """LSE [B, H, S] of [B, H, S, D] float64 tensors."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[-2]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(mask, float("-inf"))
    return torch.logsumexp(s, dim=-1)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("axes", MHA_AXES, ids=lambda a: f"S{a['S']}D{a['D']}")
def test_mha_fwd_reference_matches_sdpa_math(axes: dict[str, int], causal: bool) -> None:
    x = mha.make_fwd_inputs(axes, seed=2, device=DEV, causal=causal)
    ref = mha.fwd_reference(x, causal=causal)
    q, k, v = (x[n].double().transpose(1, 2) for n in ("Q", "K", "V"))
    with sdpa_kernel([SDPBackend.MATH]):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert ref["O"].dtype == torch.float32 and ref["LSE"].dtype == torch.float32
    assert ref["LSE"].shape == (axes["B"], axes["H"], axes["S"])
    _assert_close(ref["O"], o.transpose(1, 2), tol=1e-5, name="O")
    _assert_close(ref["LSE"], _dense_lse(q, k, causal), tol=1e-5, name="LSE")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("axes", MHA_AXES, ids=lambda a: f"S{a['S']}D{a['D']}")
def test_mha_bwd_reference_matches_autograd(axes: dict[str, int], causal: bool) -> None:
    x = mha.make_bwd_inputs(axes, seed=3, device=DEV, causal=causal)
    assert list(x) == ["Q", "K", "V", "O", "dO", "LSE"]
    q, k, v = (x[n].double().transpose(1, 2).requires_grad_() for n in ("Q", "K", "V"))
    with sdpa_kernel([SDPBackend.MATH]):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    o.backward(x["dO"].double().transpose(1, 2))
    grads = {"dQ": q.grad, "dK": k.grad, "dV": v.grad}

    # With the forward's exact (float32) O, the reference is the exact gradient.
    exact = dict(x)
    exact["O"] = mha.fwd_reference(x, causal=causal)["O"]
    ref = mha.bwd_reference(exact, causal=causal)
    for n, g in grads.items():
        _assert_close(ref[n], g.transpose(1, 2), tol=1e-4, name=n)

    # With the task's bf16 O, rowsum(dO * O) carries bf16 rounding; still well within tolerance.
    ref_bf16 = mha.bwd_reference(x, causal=causal)
    for n, g in grads.items():
        assert ref_bf16[n].dtype == torch.float32
        _assert_close(ref_bf16[n], g.transpose(1, 2), tol=1e-2, name=n)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("axes", MHA_AXES, ids=lambda a: f"S{a['S']}D{a['D']}")
def test_mha_cudnn_fwd_matches_reference(axes: dict[str, int], causal: bool) -> None:
    x = mha.make_fwd_inputs(axes, seed=4, device=DEV, causal=causal)
    out = mha.cudnn_fwd(x, causal=causal)()
    ref = mha.fwd_reference(x, causal=causal)
    assert out["O"].shape == x["Q"].shape and out["O"].dtype == torch.bfloat16
    names = ["O", "LSE"] if "LSE" in out else ["O"]
    if "LSE" in out:
        assert out["LSE"].shape == ref["LSE"].shape
    _assert_baseline_close(out, ref, names)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("axes", MHA_AXES, ids=lambda a: f"S{a['S']}D{a['D']}")
def test_mha_cudnn_bwd_matches_reference(axes: dict[str, int], causal: bool) -> None:
    x = mha.make_bwd_inputs(axes, seed=5, device=DEV, causal=causal)
    out = mha.cudnn_bwd(x, causal=causal)()
    ref = mha.bwd_reference(x, causal=causal)
    for n in ("dQ", "dK", "dV"):
        assert out[n].shape == x["Q"].shape and out[n].dtype == torch.bfloat16
    _assert_baseline_close(out, ref, ["dQ", "dK", "dV"])


# --------------------------------------------------------------------------------------------
# GQA
# --------------------------------------------------------------------------------------------


def _dense_gqa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense SDPA (math backend, float64) with KV heads repeated to 32 query heads.

    ``q`` [rows, 32, D], ``k``/``v`` [keys, 8, D], ``allowed`` [rows, keys] or None; returns
    ``o`` [rows, 32, D] and ``lse`` [rows, 32].
    """
    qh = q.double().transpose(0, 1)
    kh = k.double().repeat_interleave(gqa.GROUP_SIZE, dim=1).transpose(0, 1)
    vh = v.double().repeat_interleave(gqa.GROUP_SIZE, dim=1).transpose(0, 1)
    with sdpa_kernel([SDPBackend.MATH]):
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=allowed)
    s = qh @ kh.transpose(-1, -2) / math.sqrt(gqa.HEAD_DIM)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    return o.transpose(0, 1), torch.logsumexp(s, dim=-1).transpose(0, 1)


def _decode_inputs(seed: int = 6, outliers: bool = False) -> dict[str, torch.Tensor]:
    pages = sum(-(-n // gqa.PAGE_SIZE) for n in DECODE_KV_LENS)
    axes = {"batch_size": len(DECODE_KV_LENS), "num_pages": pages, "num_kv_indices": pages}
    return gqa.make_decode_inputs(
        axes, seed=seed, device=DEV, outliers=outliers, kv_lens=DECODE_KV_LENS
    )


def _prefill_inputs(seed: int = 7, outliers: bool = False) -> dict[str, torch.Tensor]:
    axes = {
        "batch_size": len(PREFILL_Q_LENS),
        "total_q": sum(PREFILL_Q_LENS),
        "total_kv": sum(PREFILL_KV_LENS),
    }
    return gqa.make_prefill_inputs(
        axes,
        seed=seed,
        device=DEV,
        outliers=outliers,
        q_lens=PREFILL_Q_LENS,
        kv_lens=PREFILL_KV_LENS,
    )


def test_gqa_decode_reference_matches_dense_sdpa() -> None:
    x = _decode_inputs()
    ref = gqa.decode_reference(x, kv_lens=DECODE_KV_LENS)
    assert ref["o"].shape == (len(DECODE_KV_LENS), 32, 128) and ref["o"].dtype == torch.float32
    assert ref["lse"].shape == (len(DECODE_KV_LENS), 32)
    indptr = x["kv_indptr"].tolist()
    indices = x["kv_indices"].long()
    for b, n in enumerate(DECODE_KV_LENS):
        pages = indices[indptr[b] : indptr[b + 1]]
        k = x["k_cache"][pages].reshape(-1, 8, 128)[:n]
        v = x["v_cache"][pages].reshape(-1, 8, 128)[:n]
        o, lse = _dense_gqa(x["q"][b : b + 1], k, v, None)
        _assert_close(ref["o"][b : b + 1], o, tol=1e-5, name=f"o[{b}]")
        _assert_close(ref["lse"][b : b + 1], lse, tol=1e-5, name=f"lse[{b}]")


def test_gqa_prefill_reference_matches_dense_sdpa() -> None:
    x = _prefill_inputs()
    ref = gqa.prefill_reference(x, q_lens=PREFILL_Q_LENS, kv_lens=PREFILL_KV_LENS)
    total_q = sum(PREFILL_Q_LENS)
    assert ref["o"].shape == (total_q, 32, 128) and ref["lse"].shape == (total_q, 32)
    qp, kp = x["qo_indptr"].tolist(), x["kv_indptr"].tolist()
    for b, (ql, kl) in enumerate(zip(PREFILL_Q_LENS, PREFILL_KV_LENS, strict=True)):
        i = torch.arange(ql, device=DEV).unsqueeze(1)
        j = torch.arange(kl, device=DEV).unsqueeze(0)
        allowed = j <= i + (kl - ql)  # causal, aligned bottom-right
        o, lse = _dense_gqa(
            x["q"][qp[b] : qp[b + 1]], x["k"][kp[b] : kp[b + 1]], x["v"][kp[b] : kp[b + 1]], allowed
        )
        _assert_close(ref["o"][qp[b] : qp[b + 1]], o, tol=1e-5, name=f"o[{b}]")
        _assert_close(ref["lse"][qp[b] : qp[b + 1]], lse, tol=1e-5, name=f"lse[{b}]")


@needs_flashinfer
def test_gqa_flashinfer_decode_matches_reference() -> None:
    x = _decode_inputs()
    out = gqa.flashinfer_decode(x, kv_lens=DECODE_KV_LENS)()
    ref = gqa.decode_reference(x)
    assert out["o"].dtype == torch.bfloat16
    _assert_baseline_close(out, ref, ["o", "lse"])


@needs_flashinfer
def test_gqa_flashinfer_prefill_matches_reference() -> None:
    x = _prefill_inputs()
    out = gqa.flashinfer_prefill(x, q_lens=PREFILL_Q_LENS, kv_lens=PREFILL_KV_LENS)()
    ref = gqa.prefill_reference(x)
    assert out["o"].dtype == torch.bfloat16
    _assert_baseline_close(out, ref, ["o", "lse"])


def test_gqa_baselines_explain_missing_flashinfer(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def fake_import(name: str, *args: object, **kwargs: object) -> object:
        if name == "flashinfer" or name.startswith("flashinfer."):
            raise ImportError("No module named 'flashinfer'")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ImportError, match=r"pip install 'ptxgym\[flashinfer\]'"):
        gqa.flashinfer_decode(_decode_inputs())
    with pytest.raises(ImportError, match="FlashInfer is required"):
        gqa.flashinfer_prefill(_prefill_inputs())


# --------------------------------------------------------------------------------------------
# Generators: determinism, outliers, index validity
# --------------------------------------------------------------------------------------------

GENERATORS: dict[str, Callable[[int, bool], dict[str, torch.Tensor]]] = {
    "gemm": lambda seed, outliers: gemm.make_inputs(
        {"M": 96, "N": 80, "K": 64}, seed=seed, device=DEV, outliers=outliers
    ),
    "mha_fwd": lambda seed, outliers: mha.make_fwd_inputs(
        {"B": 2, "S": 64, "H": 2, "D": 64}, seed=seed, device=DEV, outliers=outliers
    ),
    "mha_bwd": lambda seed, outliers: mha.make_bwd_inputs(
        {"B": 1, "S": 64, "H": 2, "D": 128}, seed=seed, device=DEV, outliers=outliers, causal=True
    ),
    "gqa_decode": lambda seed, outliers: _decode_inputs(seed, outliers),
    "gqa_prefill": lambda seed, outliers: _prefill_inputs(seed, outliers),
}


@pytest.mark.parametrize("name", list(GENERATORS))
def test_generators_are_deterministic_per_seed(name: str) -> None:
    make = GENERATORS[name]
    a, b, c = make(11, False), make(11, False), make(12, False)
    assert list(a) == list(b)
    for key in a:
        assert torch.equal(a[key], b[key]), f"{name}.{key} differs for the same seed"
    floats = [key for key in a if a[key].is_floating_point()]
    assert floats
    for key in floats:
        assert not torch.equal(a[key], c[key]), f"{name}.{key} is the same for different seeds"
        assert a[key].device.type == "cuda"
    # Outlier draws are deterministic too.
    o1, o2 = make(11, True), make(11, True)
    for key in o1:
        assert torch.equal(o1[key], o2[key])


@pytest.mark.parametrize("name", list(GENERATORS))
def test_outliers_change_the_distribution(name: str) -> None:
    make = GENERATORS[name]
    plain, spiky = make(13, False), make(13, True)
    drawn = [k for k in plain if plain[k].dtype == torch.bfloat16 and k != "O"]
    assert drawn
    for key in drawn:
        p, s = plain[key].float(), spiky[key].float()
        changed = p != s
        fraction = changed.float().mean().item()
        assert 0 < fraction < 0.01, f"{name}.{key}: {fraction:.4%} of elements changed"
        # Changed elements are the same draws scaled by 8-16x (up to bf16 rounding).
        ratio = (s[changed] / p[changed]).abs()
        assert ratio.min() > 7.9 and ratio.max() < 16.2, f"{name}.{key}: ratios {ratio}"
        assert s.abs().pow(4).mean() > p.abs().pow(4).mean(), f"{name}.{key}: tails not heavier"


def test_plain_inputs_have_expected_scale() -> None:
    x = mha.make_fwd_inputs({"B": 1, "S": 1024, "H": 4, "D": 128}, seed=14, device=DEV)
    assert abs(x["Q"].float().std().item() - math.sqrt(2)) < 0.05
    assert abs(x["V"].float().std().item() - 1.0) < 0.05
    # Softmax neither uniform nor one-hot: a few dozen to a few hundred keys carry the weight.
    q, k = x["Q"][0, :, 0].float(), x["K"][0, :, 0].float()
    p = torch.softmax(q @ k.T / math.sqrt(128), dim=-1)
    effective = (1.0 / (p * p).sum(-1)).median().item()
    assert 10 < effective < 500


def test_decode_indices_are_valid() -> None:
    x = _decode_inputs()
    for key in ("kv_indptr", "kv_indices", "kv_last_page_len"):
        assert x[key].dtype == torch.int32
    indptr = x["kv_indptr"].tolist()
    indices = x["kv_indices"].tolist()
    last = x["kv_last_page_len"].tolist()
    num_pages = x["k_cache"].shape[0]
    assert indptr[0] == 0 and indptr[-1] == len(indices) == num_pages
    assert all(a < b for a, b in itertools.pairwise(indptr))
    assert sorted(indices) == list(range(num_pages)), "indices must be a permutation of pages"
    assert indices != sorted(indices), "pages should be scattered"
    assert all(1 <= n <= gqa.PAGE_SIZE for n in last)
    for b, n in enumerate(DECODE_KV_LENS):
        assert (indptr[b + 1] - indptr[b] - 1) * gqa.PAGE_SIZE + last[b] == n
    assert x["q"].shape == (len(DECODE_KV_LENS), 32, 128)
    assert x["k_cache"].shape == x["v_cache"].shape == (num_pages, 16, 8, 128)


def test_prefill_indices_are_valid() -> None:
    x = _prefill_inputs()
    for key in ("qo_indptr", "kv_indptr"):
        assert x[key].dtype == torch.int32
    qp, kp = x["qo_indptr"].tolist(), x["kv_indptr"].tolist()
    assert qp[0] == 0 and qp[-1] == x["q"].shape[0]
    assert kp[0] == 0 and kp[-1] == x["k"].shape[0] == x["v"].shape[0]
    assert [b - a for a, b in itertools.pairwise(qp)] == PREFILL_Q_LENS
    assert [b - a for a, b in itertools.pairwise(kp)] == PREFILL_KV_LENS


def test_generators_reject_inconsistent_axes() -> None:
    with pytest.raises(ValueError):
        gqa.make_decode_inputs(
            {"batch_size": 2, "num_pages": 5}, seed=0, device=DEV, kv_lens=[16, 17]
        )
    with pytest.raises(ValueError):
        gqa.make_prefill_inputs({"batch_size": 1}, seed=0, device=DEV, q_lens=[10], kv_lens=[5])
    with pytest.raises(KeyError):
        gemm.make_inputs({"M": 4, "N": 4}, seed=0, device=DEV)
