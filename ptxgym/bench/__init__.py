"""Benchmarking over many episodes: ``records`` (one JSON line per turn), ``metrics`` (Fast_p and
the per-task summaries), ``quality`` (code-quality metrics of each submitted source),
``transitions`` (what changed between consecutive turns), ``report`` (tables and plots from
records, by task, model and category) and ``runner`` (the loop that drives agents over tasks,
prompt variants and trajectories, resumable)."""
