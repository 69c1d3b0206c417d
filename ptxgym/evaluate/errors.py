"""How an evaluator says that it failed, as opposed to the candidate.

A candidate's own failures (it does not build, crashes, hangs, is wrong) are outcomes with a
status, whatever the evaluator; ``EvaluatorError`` is the evaluator's: a missing dependency, a GPU
of the wrong kind, a judge or pool that died. It lives apart from every evaluator so that each,
and the code that catches it (the command line, the Ray pool), imports it without importing
another evaluator.
"""


class EvaluatorError(RuntimeError):
    """The evaluator itself failed (not the candidate): a missing dependency, a wrong GPU, a
    judge or pool that died."""
