"""A text space for source code and prompts.

Gymnasium's ``Text`` accepts only its charset (alphanumeric by default; even ``string.printable``
rejects ``é`` or ``—``), so a model reply or a prompt would fall outside it. ``SourceText`` accepts
any ``str`` within its length bound; its charset serves only ``sample()``, whose lengths are capped
so that environment checks stay fast.

Gymnasium's ``AsyncVectorEnv`` with ``shared_memory=True`` (its default, and what
``gym.make_vec(..., vectorization_mode="async")`` uses) cannot carry text: it encodes each
character as an index into the charset, and it decodes the buffer once, when the vector env is
built, so later observations would never reach the caller. ``SourceText`` therefore refuses shared
memory when the vector env is built, with a message that says what to pass instead.
"""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium.error import CustomSpaceError
from gymnasium.spaces import Text
from gymnasium.vector.utils import create_shared_memory

VECTOR_KWARGS_FOR_TEXT = {"shared_memory": False, "context": "spawn"}


class SourceText(Text):
    """Any string of at most ``max_length`` characters (empty allowed)."""

    def __init__(self, max_length: int, *, sample_max_length: int = 4096, seed: Any = None):
        super().__init__(max_length, min_length=0, charset=string.printable, seed=seed)
        self.sample_max_length = min(sample_max_length, max_length)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def sample(
        self,
        mask: tuple[int | None, np.typing.NDArray[np.int8] | None] | None = None,
        probability: tuple[int | None, np.typing.NDArray[np.float64] | None] | None = None,
    ) -> str:
        if mask is None and probability is None:
            length = int(self.np_random.integers(0, self.sample_max_length + 1))
            return super().sample(mask=(length, None))
        return super().sample(mask=mask, probability=probability)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SourceText) and other.max_length == self.max_length

    def __hash__(self) -> int:
        return hash((SourceText, self.max_length))

    def __repr__(self) -> str:
        return f"SourceText(max_length={self.max_length})"


@create_shared_memory.register(SourceText)
def _refuse_shared_memory(space: SourceText, n: int = 1, ctx: Any = None) -> None:
    raise CustomSpaceError(
        f"{space!r} observations cannot travel through Gymnasium's shared memory (it decodes "
        f"text only once, when the vector env is built): pass "
        f"vector_kwargs={VECTOR_KWARGS_FOR_TEXT!r} to gym.make_vec, or the same keywords to "
        f"AsyncVectorEnv (spawn, because a CUDA-using evaluator must not be forked)"
    )
