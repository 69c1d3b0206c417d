"""Helpers shared by the operator modules: seeded generators, input draws and precision control."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, cast

import torch

# Fraction of elements that ``outliers=True`` scales up, and the range of the scale factor.
OUTLIER_FRACTION = 1e-3
OUTLIER_SCALE_LOW = 8.0
OUTLIER_SCALE_HIGH = 16.0

# Standard deviation of attention queries and keys. With q, k ~ N(0, s^2) per element, the
# scaled score q.k / sqrt(D) has standard deviation s^2 whatever D is; s^2 = 2 gives logits with
# standard deviation 2. Measured at S = 4096, D = 128: a softmax row has about 150 keys of
# effective weight (1 / sum p^2) and its largest weight is about 4%. That is far from uniform,
# which would hide errors in the max/rescale logic, and far from one-hot, which would hide errors
# in the accumulation of P.V.
QK_STD = math.sqrt(2.0)

LN2 = math.log(2.0)
LOG2E = 1.0 / LN2


# Offset of the outlier generator's seed from the task seed (any fixed odd constant will do).
_OUTLIER_SEED_OFFSET = 0x5DEECE66D


def generator(device: str | torch.device, seed: int) -> torch.Generator:
    """Return a generator on ``device`` seeded with ``seed``."""
    return torch.Generator(device=torch.device(device)).manual_seed(int(seed))


class Draws:
    """Seeded random draws for one input set.

    The bulk values come from ``torch.Generator(device).manual_seed(seed)`` in call order; the
    outlier positions and factors come from a second generator, so the draw with
    ``outliers=True`` is the plain draw with a few elements scaled up, not a different draw.
    """

    def __init__(self, device: str | torch.device, seed: int, *, outliers: bool = False) -> None:
        self.device = torch.device(device)
        self.gen = generator(device, seed)
        self.outliers = outliers
        self._outlier_gen = generator(device, (int(seed) + _OUTLIER_SEED_OFFSET) % 2**63)

    def randn(
        self, shape: Sequence[int], *, std: float = 1.0, dtype: torch.dtype = torch.bfloat16
    ) -> torch.Tensor:
        """Draw ``N(0, std^2)`` values of ``dtype``, written once in ``dtype`` (the generator
        computes each value in float32 and rounds it).

        A worker draws every timed call's inputs afresh while it holds the GPU alone, so the
        draw is one pass that writes ``dtype``: drawing in float32, scaling and casting moved
        about 9 bytes per bf16 element instead of 2 (a paged GQA decode's 2 GB of K/V took about
        6 ms per call that way, more than its kernel).

        With ``outliers``, about ``OUTLIER_FRACTION`` of the elements (at least one) are
        multiplied by a factor drawn uniformly from ``[OUTLIER_SCALE_LOW, OUTLIER_SCALE_HIGH)``,
        so kernels that lose precision on large values (no max subtraction, low-precision
        accumulation) fail.
        """
        x = torch.empty(tuple(shape), device=self.device, dtype=dtype)
        x.normal_(0.0, std, generator=self.gen)
        if self.outliers and x.numel() > 0:
            count = max(1, round(x.numel() * OUTLIER_FRACTION))
            # Scattered flat indices rather than a dense mask: no full-size temporary. Repeated
            # indices are dropped (unique sorts) so no element is written twice, which would make
            # the result depend on the order of the scattered writes.
            og = self._outlier_gen
            idx = torch.randint(0, x.numel(), (count,), generator=og, device=self.device).unique()
            span = OUTLIER_SCALE_HIGH - OUTLIER_SCALE_LOW
            factor = OUTLIER_SCALE_LOW + span * torch.rand(
                (count,), generator=og, device=self.device, dtype=torch.float32
            )
            flat = x.view(-1)
            flat[idx] = (flat[idx].float() * factor[: idx.numel()]).to(dtype)
        return x

    def randperm(self, n: int) -> torch.Tensor:
        """Return a random permutation of ``0..n-1`` as int32."""
        return torch.randperm(n, generator=self.gen, device=self.device).to(torch.int32)

    def randint(self, low: int, high: int, shape: Sequence[int]) -> torch.Tensor:
        """Return int32 values drawn uniformly from ``[low, high)`` (never scaled as outliers:
        indices and labels have no outliers)."""
        drawn = torch.randint(low, high, tuple(shape), generator=self.gen, device=self.device)
        return drawn.to(torch.int32)


@contextlib.contextmanager
def highest_precision() -> Iterator[None]:
    """Run float32 matmuls in true float32 (no TF32), restoring the caller's setting after."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def check_axes(axes: Mapping[str, int], expected: Mapping[str, int], op: str) -> None:
    """Raise ``ValueError`` if an axis given in ``axes`` disagrees with the derived value."""
    for name, value in expected.items():
        if name in axes and int(axes[name]) != int(value):
            raise ValueError(
                f"{op}: axis {name}={axes[name]} disagrees with the value {value} implied by "
                "the other parameters"
            )


def require_axes(axes: Mapping[str, int], names: Sequence[str], op: str) -> list[int]:
    """Return the named axes as ints; raise ``KeyError`` naming any that are missing."""
    missing = [n for n in names if n not in axes]
    if missing:
        raise KeyError(f"{op}: missing axes {missing}; got {sorted(axes)}")
    values = [int(axes[n]) for n in names]
    if any(v <= 0 for v in values):
        given = dict(zip(names, values, strict=True))
        raise ValueError(f"{op}: axes must be positive, got {given}")
    return values


class LazyOutputs(Mapping[str, torch.Tensor]):
    """Outputs of one baseline call; entries given as callables are computed when first read.

    A baseline closure is timed, so it must launch only the library's own work. Where the
    library's native convention differs from the definition (FlashInfer returns a base-2 LSE),
    the conversion is deferred to the first read of that entry, outside the timed call.
    """

    def __init__(self, entries: Mapping[str, torch.Tensor | Callable[[], torch.Tensor]]) -> None:
        self._entries = dict(entries)
        self._cache: dict[str, torch.Tensor] = {}

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self._cache:
            return self._cache[key]
        entry = self._entries[key]
        value = entry if isinstance(entry, torch.Tensor) else entry()
        self._cache[key] = value
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype a task names (task dtypes are named as torch names them)."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype")
    return dtype


# One compiled callable per (function, options): torch.compile caches its graphs per shape on
# the callable, so the closures of every trial and workload share the compilation.
_COMPILED: dict[tuple[Callable[..., Any], tuple[tuple[str, object], ...]], Callable[..., Any]] = {}
_Function = TypeVar("_Function", bound=Callable[..., Any])


def compiled(function: _Function, **options: object) -> _Function:
    """``torch.compile(function)`` (static shapes, default mode: no CUDA graphs, so the timer
    sees every kernel it launches), made once per function and keyword options."""
    key = (function, tuple(sorted(options.items())))
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(function, dynamic=False, **options)
    return cast(_Function, _COMPILED[key])


def prepared(
    run: Callable[[], Mapping[str, torch.Tensor]],
) -> Callable[[], Mapping[str, torch.Tensor]]:
    """``run`` after one untimed call (a compilation, a library's plan or autotuning happen
    there, not in the timed loop)."""
    run()
    return run
