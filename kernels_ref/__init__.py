"""Trusted reference and baseline operators for ptxgym tasks.

Every operator module (``gemm``, ``mha``, ``gqa``) exposes three kinds of callables, which task
files name as ``module:function``:

``make_*inputs(axes, *, seed, device="cuda", outliers=False, **params)``
    Fresh inputs, in definition order, drawn from ``torch.Generator(device).manual_seed(seed)``.
``*reference(inputs, **params)``
    Plain PyTorch float32 math that returns every output by name, in float32.
``<library>(inputs, **params)`` (the baseline)
    Does the one-off preparation a real user of the library would already hold (planning,
    workspaces, graph builds) and returns a zero-argument closure that launches exactly the
    library computation. The closure returns a mapping from output name to tensor in the
    definition's layout and conventions.

This package needs PyTorch (and FlashInfer for the GQA baselines); it is meant for GPU hosts, and
nothing in ``ptxgym`` imports it on CPU-only machines.
"""

from __future__ import annotations

__all__ = ["gemm", "gqa", "mha"]
