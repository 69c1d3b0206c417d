"""Formats of other projects: ``flashinfer_trace`` (FlashInfer-Trace definitions, workloads,
solutions and traces, readable by FlashInfer-Bench)."""
