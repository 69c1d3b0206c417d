"""The verl hooks: the reward function and the interaction's logic run without verl (with the
compile-only evaluator); the verl classes are checked against verl itself where it is installed
(its tool registry loads examples/verl/tool_config.yaml; the interaction needs verl 0.7)."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from ptxgym import paths
from ptxgym.integrations import verl as hooks

GEMM = (paths.examples_dir() / "naive" / "gemm.cu").read_text(encoding="utf-8")
REPLY = f"Here is my kernel.\n```cuda\n{GEMM}\n```\n"
EXAMPLES = paths.examples_dir() / "verl"


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


HAS_VERL = _has("verl")
HAS_INTERACTIONS = HAS_VERL and _has("verl.interactions")


@pytest.mark.nvcc
def test_compute_score_is_the_envs_reward_with_the_outcome_as_extra_info() -> None:
    row = hooks.dataset_row("PTX-H100-GEMM")
    scored = asyncio.run(
        hooks.compute_score(
            row["data_source"],
            REPLY,
            row["reward_model"]["ground_truth"],
            row["extra_info"],
            evaluator="compile-only",
            reward_router_address=None,  # what verl may add; not used
        )
    )
    assert scored["score"] == pytest.approx(0.1) and scored["status"] == "COMPILED"
    assert scored["compiled"] == 1.0 and scored["correct"] == 0.0 and scored["speedup"] == 0.0
    assert scored["reward_compiled"] == pytest.approx(0.1)
    same = hooks.compute_score_sync("ptxgym", REPLY, "PTX-H100-GEMM", evaluator="compile-only")
    assert same == scored


def test_a_reply_without_code_scores_zero_without_evaluating() -> None:
    scored = hooks.compute_score_sync("ptxgym", "I am not sure.", "PTX-H100-GEMM")
    assert scored["status"] == "FORMAT_ERROR" and scored["score"] == 0.0


def test_a_trajectory_scored_by_the_tool_is_not_evaluated_again() -> None:
    best = {"score": 0.7, "status": "PASSED"}
    extra = {"task_id": "PTX-H100-GEMM", "ptxgym_best": best}
    assert asyncio.run(hooks.compute_score("ptxgym", "", "PTX-H100-GEMM", extra)) == best


def test_dataset_rows_carry_the_prompt_and_what_the_hooks_read() -> None:
    row = hooks.dataset_row("PTX-B200-GEMM", index=3, variant=1, knowledge="none")
    assert (
        row["prompt"][0]["role"] == "user" and 'extern "C" int gemm(' in row["prompt"][0]["content"]
    )
    assert row["reward_model"]["ground_truth"] == "PTX-B200-GEMM"
    extra = row["extra_info"]
    assert extra["index"] == 3
    assert extra["tools_kwargs"]["submit_kernel"]["create_kwargs"] == {"task_id": "PTX-B200-GEMM"}
    assert extra["interaction_kwargs"] == {"name": "ptxgym", "task_id": "PTX-B200-GEMM"}
    with pytest.raises(KeyError):
        hooks.dataset_row("PTX-H100-Nope")


@pytest.mark.nvcc
def test_the_interaction_answers_with_feedback_and_ends_after_its_turns() -> None:
    interaction = hooks.InteractionLogic(
        {"name": "ptxgym", "evaluator": "compile-only", "turns": 2}
    )

    async def episode() -> list[tuple[bool, str, float, dict[str, Any]]]:
        instance = await interaction.start_interaction(None, name="ptxgym", task_id="PTX-H100-GEMM")
        answers = []
        for reply in ("no code at all", REPLY):
            messages = [
                {"role": "user", "content": "prompt"},
                {"role": "assistant", "content": reply},
            ]
            answers.append(await interaction.generate_response(instance, messages, name="ptxgym"))
            if not answers[-1][0]:
                assert await interaction.calculate_score(instance) == answers[-1][2]
        assert await interaction.calculate_score(instance) == 0.0  # over, and forgotten
        return answers

    first, second = asyncio.run(episode())
    assert first[0] is False and first[2] == 0.0 and "FORMAT_ERROR" in first[1]
    assert first[1].endswith("reply with one ```cuda block.")
    assert second[0] is True and second[2] == pytest.approx(0.1)
    assert second[1].startswith("Status: COMPILED") and "Write the next" not in second[1]
    assert second[3]["status"] == "COMPILED"


@pytest.mark.skipif(HAS_VERL, reason="verl is installed")
def test_the_verl_classes_say_what_they_need_without_verl() -> None:
    with pytest.raises(ImportError, match="needs verl"):
        _ = hooks.KernelTool
    with pytest.raises(ImportError, match=r"needs verl<=0\.7\.1"):
        _ = hooks.KernelInteraction


def test_the_example_configs_name_the_hooks() -> None:
    tools = yaml.safe_load((EXAMPLES / "tool_config.yaml").read_text())["tools"]
    assert tools[0]["class_name"] == "ptxgym.integrations.verl.KernelTool"
    assert tools[0]["tool_schema"] == hooks.tool_schema()
    interactions = yaml.safe_load((EXAMPLES / "interaction_config.yaml").read_text())
    assert interactions["interaction"][0]["class_name"].endswith(".KernelInteraction")
    reward = yaml.safe_load((EXAMPLES / "reward.yaml").read_text())["reward"]
    function = reward["custom_reward_function"]
    assert function["path"] == "pkg://ptxgym.integrations.verl"
    assert callable(getattr(hooks, function["name"]))


@pytest.mark.nvcc
@pytest.mark.skipif(not HAS_VERL, reason="needs verl (pip install verl)")
def test_verls_tool_registry_loads_the_example_and_the_tool_scores_submissions(
    tmp_path: Path,
) -> None:
    from verl.tools.base_tool import BaseTool

    # verl 0.8 moved the registry up from verl.tools.utils.
    registry = "verl.tools.tool_registry" if _has("verl.tools.tool_registry") else None
    registry = registry or "verl.tools.utils.tool_registry"
    initialize_tools_from_config = importlib.import_module(registry).initialize_tools_from_config

    config = yaml.safe_load((EXAMPLES / "tool_config.yaml").read_text())
    config["tools"][0]["config"].update(evaluator="compile-only", turns=2)
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump(config))
    (tool,) = initialize_tools_from_config(str(path))
    assert isinstance(tool, BaseTool) and tool.name == "submit_kernel"
    agent_data = SimpleNamespace(extra_fields={})
    create_kwargs = hooks.dataset_row("PTX-H100-GEMM")["extra_info"]["tools_kwargs"]

    async def three_calls() -> list[tuple[Any, float, dict[str, Any]]]:
        answers = []
        for source in ("", GEMM, GEMM):  # as ToolAgentLoop._call_tool calls a tool
            kwargs = create_kwargs["submit_kernel"]
            instance, _ = await tool.create(create_kwargs=kwargs["create_kwargs"])
            answers.append(await tool.execute(instance, {"source": source}, agent_data=agent_data))
            await tool.release(instance)
        return answers

    empty, built, over = asyncio.run(three_calls())
    assert empty[1] == 0.0 and "FORMAT_ERROR" in empty[0].text
    assert built[1] == pytest.approx(0.1) and built[0].text.startswith("Status: COMPILED")
    assert over[1] == 0.0 and "No more submissions" in over[0].text
    best = agent_data.extra_fields["ptxgym_best"]
    assert best["status"] == "COMPILED"
    # verl hands the agent's extra fields to the reward function inside extra_info.
    scored = asyncio.run(
        hooks.compute_score("ptxgym", "", "PTX-H100-GEMM", agent_data.extra_fields)
    )
    assert scored == best


@pytest.mark.nvcc
@pytest.mark.skipif(not HAS_INTERACTIONS, reason="needs verl 0.7 (interactions)")
def test_verls_interaction_registry_loads_the_example(tmp_path: Path) -> None:
    from verl.interactions.base import BaseInteraction
    from verl.interactions.utils.interaction_registry import initialize_interactions_from_config

    config = yaml.safe_load((EXAMPLES / "interaction_config.yaml").read_text())
    config["interaction"][0]["config"]["evaluator"] = "compile-only"
    path = tmp_path / "interactions.yaml"
    path.write_text(yaml.safe_dump(config))
    interaction = initialize_interactions_from_config(str(path))["ptxgym"]
    assert isinstance(interaction, BaseInteraction)

    async def one_turn() -> tuple[bool, str, float, dict[str, Any]]:
        kwargs = hooks.dataset_row("PTX-H100-GEMM")["extra_info"]["interaction_kwargs"]
        instance = await interaction.start_interaction("trajectory-1", **kwargs)
        messages = [{"role": "assistant", "content": REPLY}]
        return await interaction.generate_response(instance, messages, **kwargs)

    done, response, score, extra = asyncio.run(one_turn())
    assert extra["status"] == "COMPILED"
    assert not done and score == pytest.approx(0.1) and response.startswith("Status: COMPILED")
