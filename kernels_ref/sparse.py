"""Sparse-matrix products in CSR form: a matrix–vector product and a matrix–dense-matrix product.

The sparse matrix ``A [M, N]`` holds ``P`` non-zeros in every row, in increasing column order
(``row_ptr[m] = m · P``; the j-th non-zero of a row at a uniform place in the j-th of P equal
segments of the columns: distinct, sorted, spread over the row, as a graph of bounded degree or
a pruned layer has)::

    spmv  y[m] = Σ_{e in row m} values[e] · x[col_idx[e]]               float32
    spmm  Y[m, :] = Σ_{e in row m} values[e] · Xd[col_idx[e], :]        float32, Xd [N, D]

References compute in float64 from the COO triples; baselines are cuSPARSE through torch
(``torch.sparse_csr_tensor(...) @ x``, a SpMV or SpMM).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from kernels_ref._common import Draws, prepared, require_axes

__all__ = ["baseline", "make_inputs", "reference"]


def make_inputs(
    axes: Mapping[str, int],
    *,
    seed: int,
    device: str = "cuda",
    outliers: bool = False,
    op: str,
) -> dict[str, torch.Tensor]:
    """Draw a CSR matrix with ``P`` distinct sorted columns per row (values ``N(0, 1)``) and the
    dense operand ``N(0, 1)``."""
    m, n, p = require_axes(axes, ("M", "N", "P"), op)
    if p > n:
        raise ValueError(f"{op}: {p} non-zeros per row do not fit {n} columns")
    draws = Draws(device, seed, outliers=outliers)
    # Stratified columns: the j-th non-zero of a row lies in the j-th of P equal segments of the
    # columns, at a uniform place within it, so a row's columns are distinct and sorted by
    # construction and spread over the whole row.
    segment = n // p
    offsets = torch.randint(0, segment, (m, p), generator=draws.gen, device=draws.device)
    starts = torch.arange(p, device=draws.device) * segment
    col_idx = (offsets + starts).to(torch.int32).reshape(-1)
    row_ptr = torch.arange(0, m * p + 1, p, dtype=torch.int32, device=draws.device)
    values = draws.randn((m * p,), dtype=torch.float32)
    dense = draws.randn((n,) if op == "spmv" else (n, axes["D"]), dtype=torch.float32)
    return {"row_ptr": row_ptr, "col_idx": col_idx, "values": values, "x": dense}


def reference(inputs: Mapping[str, torch.Tensor], *, op: str) -> dict[str, torch.Tensor]:
    """The product in float64, from the non-zeros row by row."""
    row_ptr, columns = inputs["row_ptr"].long(), inputs["col_idx"].long()
    rows = torch.repeat_interleave(
        torch.arange(row_ptr.numel() - 1, device=row_ptr.device), row_ptr.diff()
    )
    terms = inputs["values"].double()
    dense = inputs["x"].double()
    m = row_ptr.numel() - 1
    if op == "spmv":
        y = torch.zeros(m, dtype=torch.float64, device=dense.device)
        y.index_add_(0, rows, terms * dense[columns])
        return {"y": y.float()}
    out = torch.zeros((m, dense.shape[1]), dtype=torch.float64, device=dense.device)
    # In blocks of non-zeros: the gathered rows of one block stay near 1 GB.
    block = max(1, (1 << 27) // max(1, dense.shape[1]))
    for start in range(0, terms.numel(), block):
        part = slice(start, start + block)
        out.index_add_(0, rows[part], terms[part, None] * dense[columns[part]])
    return {"y": out.float()}


def baseline(
    inputs: Mapping[str, torch.Tensor], *, op: str
) -> Callable[[], Mapping[str, torch.Tensor]]:
    """cuSPARSE SpMV / SpMM through a torch CSR tensor (built once, outside the timed call)."""
    dense = inputs["x"]
    m = inputs["row_ptr"].numel() - 1
    matrix = torch.sparse_csr_tensor(
        inputs["row_ptr"], inputs["col_idx"], inputs["values"], size=(m, dense.shape[0])
    )
    if op == "spmv":
        return prepared(lambda: {"y": torch.mv(matrix, dense)})
    return prepared(lambda: {"y": matrix @ dense})
