"""What each turn leaves behind, and what is computed from it, with no GPU and nothing run again:
``turns`` (the trajectory record, one JSON line per turn, written and read), ``metrics`` (Fast_p
and the per-task summaries), ``quality`` (code-quality metrics of each submitted source),
``transitions`` (what changed between consecutive turns) and ``exports`` (failure→repair pairs
and FlashInfer-Trace datasets made of records).

The env's wrappers (``ptxgym.wrappers``) write records; the benchmark runner and the reports
(``ptxgym.bench``) read them. The trajectory record's names are given here too, as
``ptxgym.records`` gave them before this package.
"""

from ptxgym.records.turns import (
    SCHEMA_VERSION,
    TurnRecord,
    append_line,
    best_mfu,
    read_lines,
    read_records,
)

__all__ = ["SCHEMA_VERSION", "TurnRecord", "append_line", "best_mfu", "read_lines", "read_records"]
