"""The prompt (``ptxgym.prompt``) says what the judge does: the timing protocol's numbers come
from the judge's own settings, in the order the stages run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ptxgym import prompt
from ptxgym.evaluate.judge_settings import JudgeSettings
from ptxgym.prompt import build_prompt
from ptxgym.tasks import get_task

GEMM = get_task("PTX-H100-GEMM")


def evaluation_text() -> str:
    return build_prompt(GEMM).sections["evaluation"]


def test_the_prompt_states_the_judges_timing_protocol() -> None:
    settings = JudgeSettings()
    text = evaluation_text()
    assert (
        f"{settings.warmup} warm-up and then {settings.iters} timed calls per trial, "
        f"{settings.trials} trials" in text
    )
    assert f"max({settings.host_allowance_ms:g} ms, the device time)" in text
    assert settings.host_allowance_ratio == 1.0  # "the device time", unscaled
    # memcheck reruns a call after the timed loop (the judge's tool runs follow the verdict).
    assert text.index("Timing:") < text.index("memcheck")


@pytest.mark.parametrize(
    ("constant", "value", "words"),
    [
        ("WARMUP_CALLS", 7, "7 warm-up and then 50 timed calls per trial, 3 trials"),
        ("TIMED_CALLS", 20, "10 warm-up and then 20 timed calls per trial, 3 trials"),
        ("TRIALS", 5, "10 warm-up and then 50 timed calls per trial, 5 trials"),
        ("HOST_ALLOWANCE_MS", 3.5, "max(3.5 ms, the device time)"),
        ("HOST_ALLOWANCE_RATIO", 2.0, "max(2 ms, 2 x the device time)"),
    ],
)
def test_the_prompt_text_follows_the_timing_constants(
    monkeypatch: pytest.MonkeyPatch, constant: str, value: float, words: str
) -> None:
    before = evaluation_text()
    monkeypatch.setattr(prompt, constant, value)
    after = evaluation_text()
    assert after != before and words in after and words not in before


def test_the_prompt_stage_imports_neither_torch_nor_the_evaluate_stage() -> None:
    heavy = (
        "torch",
        "ptxgym.evaluate.judge",
        "ptxgym.evaluate.worker",
        "ptxgym.evaluate.evaluator",
    )
    code = (
        "import sys, ptxgym.prompt; "
        f"print(','.join(name for name in {heavy!r} if name in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""


def test_the_three_variants_frame_the_same_facts_differently() -> None:
    prompts = [build_prompt(GEMM, variant=variant) for variant in prompt.PROMPT_VARIANTS]
    assert len({p.text for p in prompts}) == 3
    for framing in ("introduction", "output"):
        assert len({p.sections[framing] for p in prompts}) == 3, framing
    facts = [
        {n: t for n, t in p.sections.items() if n not in ("introduction", "output")}
        for p in prompts
    ]
    assert facts[0] == facts[1] == facts[2]
    # The third puts the reference material first.
    assert next(iter(prompts[2].sections)).startswith("pack:")
    assert not next(iter(prompts[0].sections)).startswith("pack:")


def _words(text: str) -> str:
    return " ".join(text.split())


def test_the_prompt_carries_the_corrected_fa3_loop() -> None:
    # The corrections to FA3's Algorithm 2 (packs/h100/scheduling.md §2.3), in the pack text
    # the prompt of an attention task carries.
    text = _words(build_prompt(get_task("PTX-H100-MHAFwd-d128"), knowledge="full").text)
    start = text.index('Consumer loop with intra-warpgroup overlap (FA3 "Algorithm 2", corrected)')
    loop = text[start : text.index("// ---- epilogue ----", start)]
    # Loop bound: blocks 1 .. T_c - 1 inclusive, then the tail's last P.V.
    assert "for j = 1 .. T_c − 1: // inclusive upper bound" in loop
    assert "// ---- tail: last PV ----" in loop
    # Separate K and V ring states.
    assert "mbar_wait(&k_full[kst], kph)" in loop and "mbar_wait(&v_full[vst], vph)" in loop
    # Rescale order: m_old taken before m moves, O rescaled only once the PV that used the old
    # scale retired.
    assert loop.index("m_old = m ") < loop.index("m = max(m_old, rowmax(S)·c)")
    assert loop.index("wgmma_wait<0>() // G_PV(j−1) done") < loop.index("O *= ex2(m_old − m)")
    # Normalisation once, in the epilogue, not in the loop.
    assert "/= ℓ" not in loop
    assert "O /= ℓ // normalise ONLY here" in text[start:]
    for reason in ("Loop bound.", "Ring states.", "Rescale order.", "Normalisation."):
        assert f"**{reason}**" in text[start:], reason


@pytest.mark.parametrize(
    "knowledge", ["none", "params", "params+wrappers", "params+wrappers+contracts", "full"]
)
def test_the_pack_header_is_offered_only_where_its_wrappers_are_shown(knowledge: str) -> None:
    prompt = build_prompt(get_task("PTX-H100-GEMM"), knowledge=knowledge)
    shown = knowledge in ("params+wrappers", "params+wrappers+contracts", "full")
    rules = prompt.sections["rules"]
    assert ('#include "ptxgym_h100.cuh"' in rules) is shown
    assert ("exactly as shown below" in prompt.text) is shown


def test_the_prompt_states_the_outlier_stages_own_tolerance_where_the_task_sets_one() -> None:
    from ptxgym.tasks import Tolerance

    gemm = get_task("PTX-H100-GEMM")
    plain = build_prompt(gemm).text
    assert "a few large outliers." in plain and "checked with atol" not in plain
    loose = gemm.model_copy(update={"outlier_tolerance": Tolerance(atol=0.05, rtol=0.02)})
    assert "a few large outliers (checked with atol=0.05, rtol=0.02)." in build_prompt(loose).text
