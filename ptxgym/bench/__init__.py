"""Benchmarking over many episodes, on the records of ``ptxgym.records``: ``runs`` (records
grouped by run and by model), ``tables`` (their rows by task and by model), ``report`` (the tables
written, by task, model and category), ``categories`` (the rows by category), ``plots`` (their
Fast_p plots), ``languages`` (one agent's tasks in two action languages side by side), ``fixit``
(fix-it pairs for fine-tuning) and ``runner`` (the loop that drives agents over tasks, prompt
variants and trajectories, resumable)."""
