"""Numpy model of examples/expert/mha_bwd_d128.cu's tiling, order and roundings (CPU only).

``python examples/expert/drafts/bwd_numpy_model.py [S ...]``

Per (b, h): key tiles of 128 (one CTA), split into two consumer warpgroups of 64 keys; query
tiles of 64 streamed in the kernel's order (plain or staggered). Per tile and warpgroup, exactly
the kernel's products and roundings:
  S^T = K_g Q^T (fp32 of bf16 inputs)       P^T = 2^(S^T c - LSE log2e)
  dP^T = V_g dO^T                           dS^T = P^T (dP^T - Dr)
  dV_g += bf16(P^T) dO                      dK_g += bf16(dS^T) Q
  dQacc[:, 64g..] += bf16(dS)[:, all 128 keys] K[:, 64g..]   (after the both-warpgroup barrier)
then dK = bf16(scale dK), dV = bf16(dV), dQ = bf16(scale dQacc). Dr = rowsum(dO O) in fp32 from
the bf16 O input. The inputs follow kernels_ref.mha.make_bwd_inputs (Q, K ~ N(0, 2), V, dO ~
N(0, 1), bf16; O = bf16(forward O), LSE from the forward), optionally with the outlier stage.
The result is compared with the float64 reference formulas of kernels_ref.mha.bwd_reference under
the task's allclose(atol = rtol = 1e-2). The inputs, reference, comparison and the per-tile
products are bwd_model.py's (shared with the other backward drafts); what is this kernel's is the
query tile order and the G5 split below.

``--outliers S SEEDS`` runs the judge's outlier distribution instead and prints, per seed (one
head each), the worst err/tol with P^T and dS^T rounded to bf16 (the kernel) and to fp16.
"""

from __future__ import annotations

import sys

from bwd_model import kernel_model as bwd_kernel_model
from bwd_model import numpy_main, ring_order
from deskcheck import bf16

D = 128


def kernel_model(q, k, v, o, do, lse, stagger: bool, rnd=bf16):
    """rnd: rounding of the wgmma A operands P^T and dS^T (bf16 in the kernel)."""

    def g5(dq_acc, ds_t, k_tile, qs, kt, it) -> None:
        for g in range(2):  # G5 of both warpgroups, after the kDsBar barrier: d columns 64g..
            cols = slice(64 * g, 64 * g + 64)
            dq_acc[qs, cols] += ds_t.T @ k_tile[:, cols]

    return bwd_kernel_model(q, k, v, o, do, lse, query_tiles=ring_order(stagger), g5=g5, rnd=rnd)


def main(argv: list[str]) -> int:
    return numpy_main(argv, D, kernel_model)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
