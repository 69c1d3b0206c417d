"""The ``ptxgym`` command line: list tasks, show prompts, compile and evaluate candidates, run
agents over many tasks, report runs, repair failures with a teacher, serve a Ray pool, and the
demo. One module per command family adds its commands to the parser; ``main`` runs one and turns
the errors a user can fix into a message and exit code 2."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from ptxgym.build.result import CompilerUnavailable
from ptxgym.cli import candidates, demo, fixit, runs, serve, tasks
from ptxgym.cli.common import UnavailableError, print_json

# In the order ``ptxgym --help`` lists them.
_COMMAND_FAMILIES = (tasks, candidates, runs, fixit, serve, demo)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
    except (KeyError, ValueError, FileNotFoundError, CompilerUnavailable, UnavailableError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        if isinstance(exc, CompilerUnavailable):
            message += _cuda_home_note()
        if getattr(args, "json", False):
            # A script that asked for JSON parses stdout: it gets the reason there too.
            print_json({"error": message})
        print(f"ptxgym: error: {message}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader left (``ptxgym prompt ID | head``): not an error of ours. Output still
        # buffered must not fail again when Python flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    return code


def _cuda_home_note() -> str:
    """Why ``$CUDA_HOME`` did not help, when it is set to a folder without the tools."""
    home = os.environ.get("CUDA_HOME")
    if home is None or (Path(home) / "bin" / "nvcc").is_file():
        return ""
    return f" (CUDA_HOME={home} has no bin/nvcc: point it at the toolkit's folder)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ptxgym", description="Gymnasium environments for fast GPU kernels with PTX."
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    for family in _COMMAND_FAMILIES:
        family.add_commands(commands)
    return parser
