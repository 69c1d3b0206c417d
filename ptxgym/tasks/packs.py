"""Knowledge packs: the architecture reference given to the model inside the prompt.

A pack is a folder ``packs/<name>/`` of four parts. Knowledge levels (the paper's ablation)
select a prefix of them: ``none``; ``params``; ``params+wrappers``; ``params+wrappers+contracts``
(adds the layout, synchronisation and memory-consistency contracts); ``full`` (adds the
scheduling principles).
"""

from __future__ import annotations

from dataclasses import dataclass

from ptxgym import paths
from ptxgym.tasks.schema import Task

KNOWLEDGE_LEVELS = ("none", "params", "params+wrappers", "params+wrappers+contracts", "full")

# (file, title) in prompt order; each level takes the first N.
_PARTS = (
    ("params.md", "Architecture parameters"),
    ("wrappers.cuh", "PTX wrappers"),
    ("contracts.md", "Contracts: layouts, synchronisation, memory consistency"),
    ("scheduling.md", "Scheduling principles"),
)
_PARTS_PER_LEVEL = {
    "none": 0,
    "params": 1,
    "params+wrappers": 2,
    "params+wrappers+contracts": 3,
    "full": 4,
}


@dataclass(frozen=True)
class PackPart:
    name: str
    title: str
    text: str

    @property
    def tokens(self) -> int:
        return estimate_tokens(self.text)


def estimate_tokens(text: str) -> int:
    """Tokens as characters / 4: the usual figure for English and code under BPE tokenizers.

    An estimate, documented as such; no tokenizer is bundled, so the count is the same offline
    and for every model.
    """
    return (len(text) + 3) // 4


def load_pack(pack: str, knowledge: str) -> list[PackPart]:
    """The parts of ``pack`` that knowledge level ``knowledge`` includes."""
    if knowledge not in _PARTS_PER_LEVEL:
        raise ValueError(f"unknown knowledge level {knowledge!r}; choose one of {KNOWLEDGE_LEVELS}")
    folder = paths.packs_dir() / pack
    parts = []
    for name, title in _PARTS[: _PARTS_PER_LEVEL[knowledge]]:
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"knowledge pack {pack!r} has no {name} (looked in {folder})")
        parts.append(PackPart(name, title, path.read_text(encoding="utf-8")))
    return parts


def pack_header_name(task: Task) -> str:
    """The quoted include that brings the task's knowledge-pack wrappers into a candidate."""
    return f"ptxgym_{task.target.pack}.cuh"
