"""Shared-memory operands of examples/expert/mha_bwd_causal_d64.cu (CPU only).

``python examples/expert/drafts/bwd_causal_d64_desc_check.py``

The causal d64 kernel changes only the tile order, the mask, the CTA decode and the host's grid;
its shared-memory plan, TMA boxes, wgmma descriptors, dS^T stores, dQ staging, dQacc layout,
tensor maps and pre/post kernels are meant to be mha_bwd_d64.cu's, byte for byte. This script
proves that from the two sources, then runs the d64 draft's descriptor check on that code:

1. identity with mha_bwd_d64.cu, textually (whitespace-normalised):
   * every `constexpr k... = ...;` constant (kD, kStages, the tile sizes and offsets, the tx
     counts, barrier ids, ...), except the d64 draft's kStaggerQ and this draft's kHeadGroup;
   * the bodies of the functions that build or read operands: fence_frag, issue_xyT, issue_rs,
     issue_dq, store_dq, bwd_pre_kernel, bwd_post_kernel, make_qkv_map;
   * in the main kernel, in order, every line that touches shared memory, a barrier, a
     descriptor or the wgmma groups (smem carve-up, mbarrier init/arrive/wait, TMA and bulk
     loads, descriptors, dS^T store addresses, dQ staging pointers and rows, issue_* and
     store_dq calls, wgmma fence/commit/wait, the G5 choice and stage release, named barriers,
     the epilogue's addresses), so the wgmma ordering that bwd_d64_sync_sim.py models and the
     d64 SASS showed is this draft's too;
   * the host's tensor maps (from `CUtensorMap tmQ` to the scale).
2. bwd_d64_desc_check.main(): every element every k-step of G1-G5 reads, for both warpgroups and
   ring stages 0 and kStages - 1; the RS fragments; the dQ staging -> dQacc -> post kernel map;
   the smem plan; and that check's own negative controls.

Negative controls: four mutated copies of this draft's source (G5 k-step, dS^T swizzle XOR,
kStages, the dQ map's box) must each break the identity.
"""

from __future__ import annotations

import pathlib
import re
import sys
import time

import bwd_d64_desc_check
from deskcheck import flat

HERE = pathlib.Path(__file__).parent.parent  # the shipped kernels, in ../
SRC = (HERE / "mha_bwd_causal_d64.cu").read_text()
BASE = (HERE / "mha_bwd_d64.cu").read_text()

FUNCTIONS = (
    "fence_frag",
    "issue_xyT",
    "issue_rs",
    "issue_dq",
    "store_dq",
    "bwd_pre_kernel",
    "bwd_post_kernel",
    "make_qkv_map",
)
# Main-kernel lines that touch shared memory, a barrier, a descriptor or the wgmma groups.
KERNEL_TOKENS = (
    "smem_raw",
    "sm + kOff",
    "reinterpret_cast<uint64_t*>",
    "kv_full",
    "q_full",
    "q_empty",
    "mbar_",
    "tma_load_3d",
    "bulk_copy_g2s",
    "prefetch_tmap",
    "make_desc_",
    "ds_row",
    "ds_xor",
    "col0",
    "col1",
    "dq_stage",
    "dq_row_bh",
    "issue_",
    "store_dq(",
    "named_bar_sync",
    "fence_proxy_async",
    "kQTile",
    "kDsBytes",
    "kDqTile",
    "tok_stride",
    "off0",
    "off1",
    "st * 64",
    "key0",
    "wgmma_",
    "release_stage",
    "do_dq",
)


def constants(src: str) -> dict[str, str]:
    found = re.findall(r"constexpr (?:int|uint32_t|bool|float) (k\w+) = ([^;]+);", src)
    return {name: flat(value) for name, value in found}


def function_body(src: str, name: str) -> str:
    """From the first `name(` (its definition: each is defined before its first use) to the
    brace that closes its body."""
    start = re.search(rf"\b{name}\(", src)
    assert start is not None, f"{name} not found"
    i = src.index("{", start.start())
    depth = 0
    for j in range(i, len(src)):
        depth += {"{": 1, "}": -1}.get(src[j], 0)
        if depth == 0:
            return flat(src[start.start() : j + 1])
    raise AssertionError(f"{name}: unbalanced braces")


def kernel_lines(src: str) -> list[str]:
    """The main kernel's lines holding any of KERNEL_TOKENS, code only (comments dropped)."""
    start = re.search(r"__global__ void __launch_bounds__\(kThreads, 1\)", src)
    assert start is not None
    body = src[start.start() : src.index("// dQ[b, s, h, d] = bf16(scale * dQacc)", start.start())]
    out = []
    for line in body.splitlines():
        code = line.split("//")[0].strip()
        if code and any(tok in code for tok in KERNEL_TOKENS):
            out.append(flat(code))
    return out


def host_maps(src: str) -> str:
    i = src.index("CUtensorMap tmQ, tmK, tmV, tmdO, tmDQ;")
    return flat(src[i : src.index("const float scale =", i)])


def differences(src: str, base: str) -> list[str]:
    """What differs between the operand code of `src` (causal d64) and `base` (d64)."""
    out = []
    mine, theirs = constants(src), constants(base)
    mine.pop("kHeadGroup", None)
    theirs.pop("kStaggerQ", None)
    for name in sorted(set(mine) | set(theirs)):
        if mine.get(name) != theirs.get(name):
            out.append(f"constant {name}: {mine.get(name)} vs d64 {theirs.get(name)}")
    for name in FUNCTIONS:
        if function_body(src, name) != function_body(base, name):
            out.append(f"function {name} differs")
    a, b = kernel_lines(src), kernel_lines(base)
    if a != b:
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        where = f"line {first}: '{a[first]}' vs d64 '{b[first]}'" if first is not None else ""
        out.append(f"main-kernel operand lines differ ({len(a)} vs {len(b)}) {where}")
    if host_maps(src) != host_maps(base):
        out.append("host tensor maps differ")
    return out


def main() -> int:
    t0 = time.time()
    failures = 0
    diff = differences(SRC, BASE)
    n_lines = len(kernel_lines(SRC))
    print(
        f"identity with mha_bwd_d64.cu: {len(constants(SRC)) - 1} constants, "
        f"{len(FUNCTIONS)} functions, {n_lines} main-kernel operand lines, host maps: "
        f"{diff or 'OK'}"
    )
    failures += bool(diff)
    print("negative controls (mutated copies of this draft; each must break the identity):")
    mutations = {
        "G5 k-step 4096 B": ("const uint32_t off = 2048u *", "const uint32_t off = 4096u *"),
        "dS^T XOR with lane/8": ("(lane / 4u) << 4;", "(lane / 8u) << 4;"),
        "kStages 3": ("constexpr int kStages = 4;", "constexpr int kStages = 3;"),
        "dQ map box {64, 32}": ("256, 64, 64,", "256, 64, 32,"),
    }
    for label, (old, new) in mutations.items():
        assert SRC.count(old) == 1, f"mutation '{label}' does not apply"
        caught = bool(differences(SRC.replace(old, new), BASE))
        print(f"  {label}: {'caught' if caught else 'NOT caught'}")
        failures += not caught
    print("the d64 draft's descriptor check (bwd_d64_desc_check.py) on that identical code:")
    failures += bwd_d64_desc_check.main() != 0
    print(f"{'ALL OK' if failures == 0 else f'{failures} FAILED'} ({time.time() - t0:.1f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
