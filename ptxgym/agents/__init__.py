"""Agents that play episodes for the run loop (``ptxgym.bench.runner``): ``base`` (what an agent
and its per-episode session are), ``scripted`` (fixed files per turn) and ``openai_chat`` (a
model behind any OpenAI-compatible chat endpoint)."""
