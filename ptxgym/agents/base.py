"""What an agent is to the run loop: it opens a session per episode, and each session writes
the next action from what the episode has shown so far.

A session's ``act`` returns the action as a plain string, or as a :class:`Reply` that also says
how a model produced it (tokens, seconds, the reply in full), which the trajectory records keep.
Sessions are used by one thread each; an agent may be asked for several sessions at once (the
run loop plays episodes concurrently).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Reply:
    """An action and how it was generated (``TurnRecord.generation``)."""

    text: str
    generation: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, action: str | Reply) -> Reply:
        """A session's action as a Reply (a plain string says nothing of how it was made)."""
        return action if isinstance(action, Reply) else cls(action)


class AgentError(RuntimeError):
    """The agent cannot go on (its endpoint is down, its key refused, its model unknown): the
    run stops with this message, and running it again resumes it."""


class AgentSession(Protocol):
    """One episode's agent. ``act`` gets the observation and the last step's ``info`` (at the
    first turn, the one ``reset`` returned; on a resumed episode, one rebuilt from the last
    recorded turn, with ``info["messages"]`` holding the conversation so far)."""

    def act(self, observation: str, info: dict[str, Any]) -> str | Reply: ...


class Agent(Protocol):
    """Makes the sessions; ``name`` goes into every record (a run is played by one agent)."""

    name: str

    def session(self) -> AgentSession: ...
