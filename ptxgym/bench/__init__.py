"""Benchmarking over many episodes: ``records`` (one JSON line per turn), ``metrics`` (Fast_p and
the per-task summaries), ``report`` (tables and plots from records) and ``runner`` (the loop that
drives agents over tasks, prompt variants and trajectories, resumable)."""
