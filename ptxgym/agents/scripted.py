"""The scripted agent: fixed files, one per turn (``ptxgym run --agent scripted --files ...``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ptxgym.languages import read_action


class ScriptedAgent:
    """Submits a fixed file at each turn: turn t sends ``files[min(t - 1, len(files) - 1)]``."""

    name = "scripted"

    def __init__(self, files: Sequence[Path]) -> None:
        if not files:
            raise ValueError("a scripted agent needs at least one file")
        for path in files:
            if not Path(path).is_file():
                raise FileNotFoundError(f"{path}: no such file")
        self.files = tuple(Path(path) for path in files)

    def session(self) -> ScriptedAgent:
        """The files are the same for every episode: the agent is its own session."""
        return self

    def act(self, observation: str, info: dict[str, Any]) -> str:
        # info["turn"] counts the turns done; read from info, not kept here, so that a resumed
        # episode picks the right file.
        path = self.files[min(int(info["turn"]), len(self.files) - 1)]
        return read_action(path)
