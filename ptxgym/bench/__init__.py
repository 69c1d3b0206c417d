"""Benchmarking over many episodes: ``records`` (one JSON line per turn), ``metrics`` (Fast_p and
the per-task summaries), ``quality`` (code-quality metrics of each submitted source),
``transitions`` (what changed between consecutive turns), ``runs`` (records grouped by run
and by model), ``report`` (tables from them, by task, model and category), ``plots`` (their
Fast_p plots), ``languages`` (one agent's tasks in two action languages side by side),
``fixit`` (fix-it pairs for fine-tuning) and ``runner`` (the loop that drives agents over tasks,
prompt variants and trajectories, resumable)."""
