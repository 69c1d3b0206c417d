"""Does the GPU wait on the model? An LLM run with slow replies, evaluated on the GPU (issue 26).

Run on a GPU host: ``python benchmarks/agent_overlap.py --out DIR [--delay 10] [--concurrency 8]``.
A local OpenAI-compatible server (tests/chat_server.py) answers every request after ``--delay``
seconds with the task's naive or expert example kernel (a broken one now and then), and
``ptxgym.bench.runner.run`` plays 3 tasks × 3 prompt variants × 2 trajectories × 4 turns with the
``gpu`` evaluator and ``--concurrency`` episodes at once. The GQA decode's replies are its expert
kernel from the first turn: the naive one takes 167 ms a call, so the protocol's 180 timed and
warm-up calls on each of its 5 workloads held the GPU alone about 100 s per evaluation, and the
run with it took over 10 minutes (61 of its 72 turns in 575 s on the H200, 2026-12-02). With the
expert kernel it still takes about 6.5 minutes (70 of 72 turns in 380 s, the same day): give it a
device call of its own with `timeout 560`; if `timeout` stops it first, it still writes its
report from the turns recorded. Measured, from the records:
the share of the run's wall time, after the first reply arrived, during which at least one
evaluation (an ``env.step``) was under way; the report's per-model table and the Fast_p plot it
produced.

Prints markdown for docs/benchmarks.md and writes OUT/agent_overlap.json, OUT/run.jsonl,
OUT/report.md and OUT/fastp.png.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import sys
import time
from datetime import datetime as Datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the test server

from chat_server import ChatRequest, ChatServer, Step  # noqa: E402

from ptxgym import paths  # noqa: E402
from ptxgym.agents.openai_chat import ChatSettings, OpenAIAgent  # noqa: E402
from ptxgym.bench import report  # noqa: E402
from ptxgym.bench.runner import RunPlan, run  # noqa: E402
from ptxgym.records.turns import read_records  # noqa: E402

TASKS = ("PTX-H100-GEMM", "PTX-H100-MHAFwd-d128", "PTX-H100-GQADecode")
VARIANTS = (0, 1, 2)
KERNELS = {
    "PTX-H100-GEMM": ("naive/gemm.cu", "expert/gemm.cu"),
    "PTX-H100-MHAFwd-d128": ("naive/mha_fwd_d128.cu", "expert/mha_fwd_d128.cu"),
    "PTX-H100-GQADecode": ("expert/gqa_decode.cu", "expert/gqa_decode.cu"),
}
KEY, MODEL = "local", "scripted-model"


def model(delay_s: float) -> Any:
    def answer(request: ChatRequest) -> Step:
        task = re.search(r"PTX-H100-[A-Za-z]+(?:-d\d+)?", request.messages[0]["content"])
        assert task is not None
        naive, expert = KERNELS[task.group()]
        kernel = (paths.examples_dir() / (expert if request.turn >= 3 else naive)).read_text()
        if request.turn == 2:
            kernel = kernel.replace("return", "retrun", 1)  # a compile error now and then
        return Step(f"```cuda\n{kernel}```", delay_s=delay_s)

    return answer


def busy_share(records: list[Any], start: float, end: float) -> float:
    """The share of [start, end] covered by at least one step (its timestamp is its end)."""
    spans = sorted(
        (
            Datetime.fromisoformat(r.timestamp).timestamp() - r.step_seconds,
            Datetime.fromisoformat(r.timestamp).timestamp(),
        )
        for r in records
    )
    covered, reach = 0.0, start
    for begin, finish in spans:
        begin, finish = max(begin, reach), min(finish, end)
        if finish > begin:
            covered += finish - begin
            reach = finish
    return covered / (end - start)


def summarise(args: argparse.Namespace, started: float, ended: float, first_reply: float) -> None:
    """Write OUT/report.md, OUT/fastp.png and OUT/agent_overlap.json from the turns recorded in
    OUT/run.jsonl, and print the markdown."""
    out = args.out / "run.jsonl"
    records = list(read_records(out))
    if not records:
        print("no turn was recorded")
        return
    share = busy_share(records, first_reply, ended)
    table = report.report([out], plot=args.out / "fastp.png")
    (args.out / "report.md").write_text(table)
    complete = len(records) == len(TASKS) * len(VARIANTS) * args.trajectories * args.turns
    results = {
        "date": datetime.date.today().isoformat(),
        "delay_s": args.delay,
        "concurrency": args.concurrency,
        "turns": len(records),
        "complete": complete,
        "wall_s": ended - started,
        "evaluation_busy_share": share,
        "statuses": {s: sum(r.status == s for r in records) for s in {r.status for r in records}},
    }
    (args.out / "agent_overlap.json").write_text(json.dumps(results, indent=2))
    cut = "" if complete else " (stopped before the run's end)"
    print(
        f"# LLM run on the GPU, {results['date']}: {len(records)} turns in "
        f"{ended - started:.0f} s{cut}"
    )
    print(
        f"\nreply delay {args.delay:g} s, concurrency {args.concurrency}: at least one "
        f"evaluation under way {share:.0%} of the wall time after the first reply\n"
    )
    print(table)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    parser.add_argument("--delay", type=float, default=10.0, help="seconds per reply")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--trajectories", type=int, default=2)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--evaluator", default="gpu", help="gpu (the measurement) or compile-only")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "run.jsonl"
    out.unlink(missing_ok=True)
    os.environ["PTXGYM_BENCH_KEY"] = KEY
    plan = RunPlan(
        name="overlap",
        tasks=TASKS,
        variants=VARIANTS,
        trajectories=args.trajectories,
        turns=args.turns,
        evaluator=args.evaluator,
    )
    with ChatServer(model(args.delay), api_key=KEY, models=(MODEL,)) as server:
        agent = OpenAIAgent(
            ChatSettings(model=MODEL, base_url=server.base_url, api_key_env="PTXGYM_BENCH_KEY")
        )
        started, clock = time.time(), time.monotonic()  # the server stamps monotonic time

        def first_reply() -> float:
            received = [r.received_at for r in server.completions]
            return (min(received) - clock + started + args.delay) if received else started

        def stopped(signum: int, frame: object) -> None:
            # `timeout` ends the run: report what was recorded, then leave at once (evaluations
            # still under way in other threads are not waited for).
            summarise(args, started, time.time(), first_reply())
            sys.stdout.flush()
            os._exit(128 + signum)

        signal.signal(signal.SIGTERM, stopped)
        run(plan, agent, out, progress=False, concurrency=args.concurrency)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        summarise(args, started, time.time(), first_reply())


if __name__ == "__main__":
    main()
