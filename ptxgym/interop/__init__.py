"""Formats of other projects: ``flashinfer_trace`` (FlashInfer-Trace definitions, workloads,
solutions and traces, readable by FlashInfer-Bench), with their schema (``flashinfer_schema``) and
a task's reference made self-contained for them (``reference_source``)."""
