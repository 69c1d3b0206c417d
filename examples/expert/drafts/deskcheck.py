"""What the drafts' desk checks share (a library, not a check: manifest.yaml lists it as a helper).

* ``CheckError`` / ``require``: a failed check;
* ``constexprs``: a kernel source's integer ``constexpr`` constants, evaluated in source order;
  ``flat`` / ``assert_mirrored``: C++ compared up to spacing, and the check that every line a
  model mirrors still stands in the kernel's source;
* ``online_softmax_block``: one K/V block of the kernels' online softmax (numpy);
* ``bf16``: float32 -> bf16 (round to nearest even), returned as float32;
* ``acc_coord`` / ``afrag_coord``: the wgmma accumulator and register-A fragment maps
  (contracts §2);
* ``dc``: the swizzle / descriptor model of ../desc_check.py, imported by path (not copied, so
  the GPU-verified original stays the one model), ``tma_box64`` / ``make_desc128`` for the
  [rows][64] bf16 boxes with the 128B swizzle that the drafts use, and ``wrong_reads``, the
  count of elements of one k-step that a descriptor reads wrong;
* the synchronisation model: ``MBar`` (an mbarrier with the PTX phase rule),
  ``NamedBarriers`` (bar.sync / bar.arrive as the hardware counts them) and ``interleave``, the
  random-interleaving driver of generator actors;
* ``negative_controls``: runs deliberately wrong variants over many runs and prints how often
  each was caught.
"""

from __future__ import annotations

import importlib.util
import random
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np


class CheckError(Exception):
    pass


def run_checks(checks: Callable[[], None]) -> int:
    """A desk check's exit status: runs ``checks``, prints the first failed check (1) or
    ALL CHECKS OK (0)."""
    try:
        checks()
    except CheckError as e:
        print(f"CHECK FAILED: {e}")
        return 1
    print("ALL CHECKS OK")
    return 0


def require(cond: bool, what: str) -> None:
    if not cond:
        raise CheckError(what)


def constexprs(src: str) -> dict[str, int]:
    """Integer `constexpr int|uint32_t|uint16_t kName = expr;` definitions, in source order."""
    values: dict[str, int] = {}
    pattern = r"constexpr\s+(?:int|uint32_t|uint16_t)\s+(\w+)\s*=\s*([^;]+);"
    for name, expr in re.findall(pattern, src):
        expr = re.sub(r"//.*", "", expr)
        expr = re.sub(r"(\d+)u\b", r"\1", expr)  # 1024u -> 1024
        try:
            values[name] = int(eval(expr, {"__builtins__": {}}, dict(values)))
        except (NameError, SyntaxError, TypeError):
            continue  # not an integer the checks need (float, casts)
    return values


def flat(text: str) -> str:
    """``text`` with every run of white space made one space: C++ compared up to spacing."""
    return " ".join(text.split())


def assert_mirrored(src: str, lines: Iterable[str], what: str) -> None:
    """Every C++ line a model mirrors must occur verbatim (up to spacing) in the source ``src``,
    so that an edit of the kernel that the model does not follow fails the check."""
    source = flat(src)
    for line in lines:
        require(flat(line) in source, f"{what}: mirrored line not in the source: {line}")


def bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to bf16 (nearest even), returned as float32."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def online_softmax_block(
    s: np.ndarray, c: float, m: np.ndarray, row_sum: np.ndarray, sc: np.ndarray, first: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One K/V block of the kernels' online softmax in the log2 domain (scores ``s`` times ``c``),
    with FA2's Check_inf: a row whose scores are all masked so far exponentiates against 0, so it
    gets P = 0 and no NaN. Returns the block's P, the factor that rescales the rows' sums and O
    of the blocks before (``sc`` unchanged for the first block), and the running max and row sum
    after the block."""
    mx = s.max(axis=1) * c
    mn = mx if first else np.maximum(m, mx)
    mu = np.where(mn == -np.inf, 0.0, mn)
    with np.errstate(invalid="raise"):
        if not first:
            sc = np.exp2(m - mu)
        p = np.exp2(s * c - mu[:, None])
    row_sum = p.sum(axis=1) if first else row_sum * sc + p.sum(axis=1)
    return p, sc, mn, row_sum


# ---------------------------------------------------------------------------------------------
# Register maps (contracts §2)
# ---------------------------------------------------------------------------------------------
def acc_coord(t: int, i: int) -> tuple[int, int]:
    """contracts §2: (row, col) of f32 accumulator register i of thread t (m64nN)."""
    w, lane = t // 32, t % 32
    return 16 * w + lane // 4 + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * (lane % 4) + (i % 2)


def afrag_coord(t: int, reg: int, half: int) -> tuple[int, int]:
    """contracts §2 register-A fragment: (row, k) of bf16 `half` (0 = low) of a[reg]."""
    w, lane = t // 32, t % 32
    r0, q = 16 * w + lane // 4, lane % 4
    row = r0 + 8 * (reg % 2)
    k = 2 * q + 8 * (reg // 2) + half
    return row, k


# ---------------------------------------------------------------------------------------------
# Shared-memory descriptors: the model of ../desc_check.py
# ---------------------------------------------------------------------------------------------
_spec = importlib.util.spec_from_file_location(
    "desc_check", Path(__file__).resolve().parent.parent / "desc_check.py"
)
assert _spec is not None and _spec.loader is not None
dc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dc)

Smem = dict[int, tuple]
SPAN = 128  # the drafts' boxes are [rows][64] bf16 with CU_TENSOR_MAP_SWIZZLE_128B


def tma_box64(smem: Smem, base: int, name: str, rows: int, d0: int) -> None:
    """One TMA box [rows][64] bf16 of tensor `name`, columns d0.., written at `base` (swizzled)."""
    for r in range(rows):
        for e in range(64):
            smem[dc.swizzle(base + r * 128 + 2 * e, SPAN)] = (name, r, d0 + e)


def make_desc128(start: int, lbo: int, sbo: int) -> int:
    """ptx::make_smem_desc with layout 1 (128B swizzle)."""
    return dc.make_desc(start, SPAN, lbo, sbo)


SPAN64 = 64  # the d96 drafts' boxes are [rows][32] bf16 with CU_TENSOR_MAP_SWIZZLE_64B


def tma_box_sw64(smem: Smem, base: int, name: str, rows: int, d0: int) -> None:
    """One TMA box [rows][32] bf16 of tensor `name`, columns d0.., written at `base` with the 64B
    swizzle (64-B rows), as ../mha_fwd_d96.cu loads its tiles."""
    for r in range(rows):
        for e in range(32):
            smem[dc.swizzle(base + r * 64 + 2 * e, SPAN64)] = (name, r, d0 + e)


def make_desc64(start: int, lbo: int, sbo: int) -> int:
    """ptx::make_smem_desc with layout 2 (64B swizzle)."""
    return dc.make_desc(start, SPAN64, lbo, sbo)


def wrong_reads(
    smem: Smem,
    desc: int,
    n_mn: int,
    name: str,
    row0: int,
    col0: int,
    *,
    mn_major: bool = False,
    k_is_row: bool = False,
) -> int:
    """How many elements (mn, k), mn < n_mn, k < 16, of one k-step of a wgmma operand read
    through `desc` (K-major, or MN-major) are not element (row0 + mn, col0 + k) of tensor `name`
    ((row0 + k, col0 + mn) with k_is_row)."""
    read = dc.read_mnmajor if mn_major else dc.read_kmajor
    wrong = 0
    for k in range(16):
        for mn in range(n_mn):
            want = (name, row0 + k, col0 + mn) if k_is_row else (name, row0 + mn, col0 + k)
            wrong += read(smem, desc, mn, k) != want
    return wrong


# ---------------------------------------------------------------------------------------------
# Synchronisation: mbarriers, named barriers and the random-interleaving driver
# ---------------------------------------------------------------------------------------------
class MBar:
    """An mbarrier with the PTX phase rule: a phase completes when its pending arrivals and tx
    bytes reach 0, and try_wait.parity(P) passes iff the current phase's parity differs from P."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.pending = count
        self.tx = 0
        self.phase = 0  # completed phases

    def _maybe_complete(self) -> None:
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def arrive(self, expect_tx: int = 0) -> None:
        if self.pending <= 0:
            raise CheckError("arrival on a barrier with no pending arrivals")
        self.tx += expect_tx
        self.pending -= 1
        self._maybe_complete()

    def complete_tx(self, nbytes: int) -> None:
        self.tx -= nbytes
        self._maybe_complete()

    def passes(self, parity: int) -> bool:
        return (self.phase & 1) != parity


def _raise(what: str) -> None:
    raise CheckError(what)


class NamedBarriers:
    """Named barriers as the hardware counts them: per barrier, the arrivals of the current
    generation; a generation completes when `members` have arrived. An actor arriving twice in
    one generation is reported (to `report`; by default it raises CheckError)."""

    def __init__(self, report: Callable[[str], None] = _raise) -> None:
        self.report = report
        self.waiting: dict = {}  # barrier -> actors arrived in the current generation
        self.gen: dict = {}  # barrier -> completed generations

    def arrive(self, name, me, members: int) -> int:
        """bar.arrive: counts `me` and returns the generation it arrived in."""
        gen = self.gen.get(name, 0)
        arrived = self.waiting.setdefault(name, [])
        if me in arrived:
            self.report(f"{me} arrived twice in generation {gen} of barrier {name}")
        arrived.append(me)
        if len(arrived) == members:
            self.gen[name] = gen + 1
            self.waiting[name] = []
        return gen

    def sync(self, name, me, members: int):
        """bar.sync, as actor steps: arrive, then spin (yield False) until the generation
        completes."""
        gen = self.arrive(name, me, members)
        while self.gen.get(name, 0) == gen:
            yield False
        yield True

    def balanced(self) -> bool:
        """No generation left part-way."""
        return not any(self.waiting.values())


def interleave(
    actors: list, rng: random.Random, stall_limit: int = 20000, max_steps: int | None = None
) -> bool:
    """Runs generator actors one step at a time in a random global interleaving until all end.

    A step yields True or None (it ran), False (it spun on a wait that did not pass; the actor
    stays runnable, and `stall_limit` spins in a row anywhere are a deadlock) or a tuple
    ``("wait", barrier, parity)`` (the actor blocks until ``barrier.passes(parity)``; no runnable
    actor left is a deadlock). Actors may append new actors to the list while it runs (async
    copies issued by a producer). Returns False on a deadlock or after `max_steps` steps.
    """
    done: set[int] = set()
    blocked: dict[int, tuple] = {}
    stall = steps = 0
    while len(done) < len(actors):
        runnable = [
            i
            for i in range(len(actors))
            if i not in done and (i not in blocked or blocked[i][1].passes(blocked[i][2]))
        ]
        if not runnable:
            return False
        i = rng.choice(runnable)
        blocked.pop(i, None)
        try:
            step = next(actors[i])
        except StopIteration:
            done.add(i)
            step = True
        if isinstance(step, tuple):
            blocked[i] = step
        stall = stall + 1 if step is False else 0
        steps += 1
        if stall > stall_limit or (max_steps is not None and steps >= max_steps):
            return False
    return True


def negative_controls(bugs: Iterable[str], runs: int, failed: Callable[[str, int], bool]) -> bool:
    """Each deliberate bug must be caught in some run: failed(bug, r) for r < runs (True = caught)
    per bug, printing in how many runs each was caught; returns whether every bug was caught."""
    caught_all = True
    for bug in bugs:
        caught = sum(bool(failed(bug, r)) for r in range(runs))
        print(f"negative control {bug}: caught in {caught}/{runs} runs")
        caught_all &= caught > 0
    return caught_all
