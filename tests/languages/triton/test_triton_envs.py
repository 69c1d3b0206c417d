"""Every registered task as a Triton environment: the env passes Gymnasium's checker, and its
prompt states the Triton contract (``ptxgym.languages.triton.prompt``), compile-only, no GPU."""

from __future__ import annotations

import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import ptxgym
from ptxgym.languages.triton.policy import ALLOWED_IMPORTS, entry_parameters
from ptxgym.languages.triton.prompt import TRITON_VERSION
from ptxgym.prompt import build_prompt
from ptxgym.tasks import get_task

PTX_SPECS = [spec for spec in gym.registry.values() if spec.entry_point == ptxgym.ENTRY_POINT]


@pytest.mark.parametrize("spec", PTX_SPECS, ids=lambda spec: spec.id)
def test_check_env_passes_for_every_task_in_triton(
    spec: gym.envs.registration.EnvSpec, capsys: pytest.CaptureFixture[str]
) -> None:
    env = spec.make(disable_env_checker=True, evaluator="compile-only", language="triton")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)
    observation, _ = env.reset()
    env.close()
    assert [str(warning.message) for warning in caught] == []
    task = get_task(spec.id)
    signature = f"def {task.entry_point.symbol}({', '.join(entry_parameters(task))}) -> None"
    assert signature in observation
    assert "```python code block" in observation and "```cuda code block" not in observation
    assert 'extern "C"' not in observation
    capsys.readouterr()


def test_the_prompt_states_the_triton_contract() -> None:
    prompt = build_prompt(get_task("PTX-H100-GEMM"), language="triton")
    text = prompt.text
    assert f"Triton {TRITON_VERSION}" in prompt.sections["target"]
    assert "`tl.dot`" in prompt.sections["interface"] and "wgmma (SASS HGMMA)" in text
    assert "TensorDescriptor.from_tensor" in text and "UTMALDG" in text
    for line in ALLOWED_IMPORTS:
        assert f"`{line}`" in prompt.sections["rules"]
    assert "torch.matmul" in prompt.sections["rules"]
    # The pack's C++ wrappers cannot be used from Triton: not shown, and no header offered.
    assert not any(name.endswith(".cuh") for name in prompt.sections)
    assert "#include" not in prompt.sections["rules"]


def test_the_blackwell_prompt_names_tcgen05() -> None:
    text = build_prompt(get_task("PTX-B200-GEMM"), language="triton").text
    assert "tcgen05" in text and "LDTM" in text


def test_the_three_variants_frame_the_same_triton_facts() -> None:
    task = get_task("PTX-H100-MHAFwd-d128")
    prompts = [build_prompt(task, variant=v, language="triton") for v in (0, 1, 2)]
    assert len({p.sections["output"] for p in prompts}) == 3
    assert len({p.sections["interface"] for p in prompts}) == 1
