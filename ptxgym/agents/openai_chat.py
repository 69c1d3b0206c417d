"""The LLM agent: a multi-turn conversation with any OpenAI-compatible chat endpoint.

As PTXBench's agent does, turn 1 sends the prompt, and each later turn sends the step's feedback
as the next user message, the whole conversation kept (the run loop wraps each env in
``ptxgym.wrappers.ChatMessages``, whose ``info["messages"]`` is that conversation). It talks to
vLLM, SGLang or OpenAI through the official ``openai`` client (``base_url``, a key from an
environment variable, the model, sampling options, optional reasoning effort), whose retries
(exponential backoff, ``Retry-After`` honoured) cover rate limits, server errors, timeouts and
dropped connections.

When the conversation outgrows the model's context (``ChatSettings.context_tokens``), the oldest
replies are replaced by a one-line note first (their kernels are long and superseded; their
feedback stays), then the oldest feedback; the prompt and the last exchange are never cut
(``fit_context``). Token counts are estimated from characters (4 per token), so the budget
should leave a margin.

A reply without code is the env's ``FORMAT_ERROR`` turn, not a failure of the agent. A refused
key, an unknown model, a malformed request, or an endpoint still failing after the retries end
the run with an :class:`~ptxgym.agents.base.AgentError`; running it again resumes it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ptxgym.agents.base import AgentError, Reply

CHARS_PER_TOKEN = 4
_MESSAGE_OVERHEAD_TOKENS = 4  # role and separators, as chat templates add them
OMITTED_REPLY = (
    "[your reply of turn {turn} is omitted here to fit the context; its feedback follows]"
)
OMITTED_FEEDBACK = "[the feedback on turn {turn} is omitted here to fit the context]"


@dataclass(frozen=True)
class ChatSettings:
    """Where the model is and how to sample it. ``api_key_env`` names the environment variable
    that holds the key (for a server without keys, set it to any value, e.g. ``EMPTY``).
    ``context_tokens``: the model's context window, for ``fit_context`` (None: never trimmed).
    ``extra_body``: fields sent as they are (e.g. vLLM's ``top_k``)."""

    model: str
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    system: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    reasoning_effort: str | None = None
    context_tokens: int | None = None
    timeout_s: float = 600.0
    max_retries: int = 5
    extra_body: dict[str, Any] = field(default_factory=dict)

    def sampling(self) -> dict[str, Any]:
        """The request's options beside the model and the messages (only those set)."""
        options: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_completion_tokens": self.max_tokens,
            "seed": self.seed,
            "reasoning_effort": self.reasoning_effort,
        }
        chosen = {name: value for name, value in options.items() if value is not None}
        if self.extra_body:
            chosen["extra_body"] = dict(self.extra_body)
        return chosen


class OpenAIAgent:
    """An agent whose sessions ask the chat endpoint of ``settings`` for each action."""

    def __init__(self, settings: ChatSettings) -> None:
        try:
            import openai
        except ImportError:
            raise AgentError(
                "the LLM agent needs the openai client: pip install 'ptxgym[agents]'"
            ) from None
        key = os.environ.get(settings.api_key_env)
        if not key:
            raise AgentError(
                f"set {settings.api_key_env} to the endpoint's API key (for a server without "
                "keys, to any value, e.g. EMPTY), or name another variable with --api-key-env"
            )
        self.settings = settings
        self.name = f"openai:{settings.model}"
        self.client = openai.OpenAI(
            base_url=settings.base_url,
            api_key=key,
            max_retries=settings.max_retries,
            timeout=settings.timeout_s,
        )

    def session(self) -> OpenAISession:
        return OpenAISession(self)

    def close(self) -> None:
        self.client.close()


class OpenAISession:
    """One episode's conversation with the model."""

    def __init__(self, agent: OpenAIAgent) -> None:
        self.agent = agent

    def act(self, observation: str, info: dict[str, Any]) -> Reply:
        import openai

        settings = self.agent.settings
        conversation = list(info.get("messages") or [{"role": "user", "content": observation}])
        if settings.system is not None:
            conversation.insert(0, {"role": "system", "content": settings.system})
        messages, omitted = fit_context(conversation, settings.context_tokens, settings.max_tokens)
        endpoint = settings.base_url or "the OpenAI API"
        started = time.perf_counter()
        try:
            response = self.agent.client.chat.completions.create(
                model=settings.model,
                messages=messages,  # type: ignore[arg-type]
                **settings.sampling(),
            )
        except (
            openai.AuthenticationError,
            openai.PermissionDeniedError,
            openai.NotFoundError,
            openai.BadRequestError,
        ) as exc:
            raise AgentError(
                f"{endpoint} refused the request ({exc.status_code}): {exc.message}"
            ) from None
        except (openai.APIConnectionError, openai.APIStatusError) as exc:  # timeouts included
            raise AgentError(
                f"{endpoint} still failed after {settings.max_retries} retries: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        seconds = time.perf_counter() - started
        choice = response.choices[0] if response.choices else None
        text = (choice.message.content if choice is not None else None) or ""
        usage = response.usage
        return Reply(
            text,
            {
                "model": response.model or settings.model,
                "reply": text,
                "prompt_tokens": usage.prompt_tokens if usage is not None else None,
                "completion_tokens": usage.completion_tokens if usage is not None else None,
                "seconds": seconds,
                "finish_reason": choice.finish_reason if choice is not None else None,
                "omitted_messages": omitted,
            },
        )


def estimate_tokens(messages: Sequence[dict[str, str]]) -> int:
    """A conversation's size in tokens, estimated from its characters."""
    return sum(
        len(message["content"]) // CHARS_PER_TOKEN + _MESSAGE_OVERHEAD_TOKENS
        for message in messages
    )


def fit_context(
    messages: Sequence[dict[str, str]], context_tokens: int | None, reply_tokens: int | None
) -> tuple[list[dict[str, str]], int]:
    """``messages`` cut to fit ``context_tokens`` with room for a reply of ``reply_tokens``,
    and how many messages were replaced by a note. Older replies go first, then older
    feedback; system messages, the first user message (the prompt) and the last two messages
    stay whole (so the result may still be too long, which the endpoint then says)."""
    fitted = [dict(message) for message in messages]
    if context_tokens is None:
        return fitted, 0
    budget = context_tokens - (reply_tokens or 0)
    first_user = next((i for i, m in enumerate(fitted) if m["role"] == "user"), 0)
    cuttable = [i for i in range(first_user + 1, len(fitted) - 2) if fitted[i]["role"] != "system"]
    turn_of = {
        index: 1 + sum(m["role"] == "assistant" for m in fitted[:index]) for index in cuttable
    }
    omitted = 0
    for role, note in (("assistant", OMITTED_REPLY), ("user", OMITTED_FEEDBACK)):
        for index in cuttable:
            if estimate_tokens(fitted) <= budget:
                return fitted, omitted
            if fitted[index]["role"] == role:
                # A reply's turn counts the replies before it and itself; feedback is on the
                # reply just before it.
                turn = turn_of[index] if role == "assistant" else turn_of[index] - 1
                fitted[index]["content"] = note.format(turn=turn)
                omitted += 1
    return fitted, omitted
