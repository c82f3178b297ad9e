"""AgentLoopManager: concurrent loops per sample, loop choice by agent_name, padding, metrics, config errors."""

from __future__ import annotations

import dataclasses
import textwrap

import numpy as np
import pytest
import torch

from hyflow import fields as F
from hyflow.agent.loop import AgentData, AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, registered_agent_loops
from hyflow.agent.manager import AgentLoopManager, batch_metrics
from hyflow.config.actor_rollout_ref import RolloutConfig
from hyflow.protocol import DataProto

pytestmark = pytest.mark.timeout(60)


def rollout_config(tmp_path, tools: bool = True, response_length: int = 48, **overrides) -> RolloutConfig:
    config = RolloutConfig(prompt_length=384, response_length=response_length, **overrides)
    if tools:
        path = tmp_path / "tools.yaml"
        path.write_text("tools:\n  - class_name: calculator\n")
        config.multi_turn.tool_config_path = str(path)
    return config


def batch(agent_names: list[str] | None = None, n: int = 3, **meta) -> DataProto:
    prompts = [[{"role": "user", "content": f"q{i}" * (i + 1)}] for i in range(n)]
    non_tensors = {F.RAW_PROMPT: prompts, F.UID: [f"u{i}" for i in range(n)]}
    if agent_names is not None:
        non_tensors[F.AGENT_NAME] = agent_names
    return DataProto.from_dict(non_tensors=non_tensors, meta_info=meta)


def test_outputs_are_left_padded_prompts_and_right_padded_responses(tmp_path, tokenizer, make_server):
    server = make_server(lambda prompt, turn: "x" * (prompt.count("q") * 3))
    manager = AgentLoopManager(rollout_config(tmp_path), tokenizer, [server])
    out = manager.generate_sequences(batch())
    assert out.batch[F.PROMPTS].shape == (3, 384) and out.batch[F.RESPONSES].shape == (3, 48)
    assert out.batch[F.INPUT_IDS].shape == out.batch[F.ATTENTION_MASK].shape == (3, 432)
    pad = tokenizer.pad_token_id
    for i in range(3):
        prompt_mask = out.batch[F.ATTENTION_MASK][i, :384]
        num_prompt = int(prompt_mask.sum())
        assert prompt_mask[: 384 - num_prompt].eq(0).all() and prompt_mask[384 - num_prompt :].eq(1).all()
        assert out.batch[F.PROMPTS][i, : 384 - num_prompt].eq(pad).all()
        num_response = int(out.batch[F.RESPONSE_MASK][i].sum())
        assert num_response == len(tokenizer.encode("x" * 3 * (i + 1))) + 1  # + eos
        assert out.batch[F.RESPONSES][i, num_response:].eq(pad).all()
        positions = out.batch[F.POSITION_IDS][i]
        valid = out.batch[F.ATTENTION_MASK][i].bool()
        assert torch.equal(positions[valid], torch.arange(int(valid.sum())))
        log_probs = out.batch[F.ROLLOUT_LOG_PROBS][i]
        assert log_probs[:num_response].lt(0).all() and log_probs[num_response:].eq(0).all()
    assert list(out.non_tensor_batch[F.NUM_TURNS]) == [2, 2, 2]
    assert list(out.non_tensor_batch[F.FINISH_REASON]) == ["stop"] * 3
    assert out.meta_info[F.METRICS]["agent/finish_reason/stop"] == 1.0
    assert "agent_loop/generate_sequences" in out.meta_info[F.TIMING]


def test_each_sample_runs_the_loop_named_by_its_agent_name(tmp_path, tokenizer, make_server, call_text):
    server = make_server([call_text("calculator", expression="1 + 1"), "2"])
    manager = AgentLoopManager(rollout_config(tmp_path), tokenizer, [server])
    out = manager.generate_sequences(batch(["single_turn_agent", "tool_agent"], n=2))
    assert list(out.non_tensor_batch[F.NUM_TURNS]) == [2, 4]
    masks = out.batch[F.RESPONSE_MASK]
    assert masks[0].sum() == out.batch[F.ATTENTION_MASK][0, 384:].sum()  # single turn: all model tokens
    assert masks[1].sum() < out.batch[F.ATTENTION_MASK][1, 384:].sum()  # tool tokens are masked out
    assert out.non_tensor_batch["tool_rewards"][1] == [0.0]
    assert out.meta_info[F.METRICS]["agent/num_tool_calls/mean"] == 0.5


def test_samples_without_agent_name_use_the_default_loop(tmp_path, tokenizer, make_server, call_text):
    server = make_server([call_text("calculator", expression="1 + 1"), "2"])
    config = rollout_config(tmp_path)
    config.agent.default_agent_loop = "tool_agent"
    out = AgentLoopManager(config, tokenizer, [server]).generate_sequences(batch(n=2))
    assert list(out.non_tensor_batch[F.NUM_TURNS]) == [4, 4]


def test_the_loops_of_a_batch_run_concurrently(tmp_path, tokenizer, make_server):
    server = make_server(["ok"], delay=0.05)
    AgentLoopManager(rollout_config(tmp_path), tokenizer, [server]).generate_sequences(batch(n=8))
    assert server.peak_in_flight == 8


def test_all_turns_of_a_sample_stay_on_one_server(tmp_path, tokenizer, make_server, call_text):
    script = [call_text("calculator", expression="1 + 1"), call_text("calculator", expression="2 + 2"), "4"]
    servers = [make_server(script), make_server(script)]
    manager = AgentLoopManager(rollout_config(tmp_path, response_length=256), tokenizer, servers)
    manager.generate_sequences(batch(["tool_agent"] * 4, n=4))
    for server in servers:
        assert len(server.turns) == 2 and all(turns == 3 for turns in server.turns.values())
    assert manager.router.active == [0, 0]


def test_validation_batches_sample_with_val_kwargs_and_do_sample_false_is_greedy(tmp_path, tokenizer, make_server):
    server = make_server(["ok"])
    manager = AgentLoopManager(rollout_config(tmp_path, temperature=0.7, top_p=0.9), tokenizer, [server])
    manager.generate_sequences(batch(n=1))
    manager.generate_sequences(batch(n=1, validate=True))
    manager.generate_sequences(batch(n=1, do_sample=False))
    first, validation, greedy = (call["params"] for call in server.calls)
    assert (first.temperature, first.top_p, first.max_tokens) == (0.7, 0.9, 48)
    assert validation.temperature == 0.0 and validation.top_p == 1.0
    assert greedy.temperature == 0.0


def test_an_unknown_agent_name_fails_before_any_generation(tmp_path, tokenizer, make_server):
    server = make_server(["ok"])
    manager = AgentLoopManager(rollout_config(tmp_path), tokenizer, [server])
    with pytest.raises(ValueError, match=r"agent_name='web_agent'.*single_turn_agent.*tool_agent"):
        manager.generate_sequences(batch(["single_turn_agent", "web_agent"], n=2))
    assert server.calls == []


def test_an_empty_batch_is_a_clear_error(tmp_path, tokenizer, make_server):
    manager = AgentLoopManager(rollout_config(tmp_path), tokenizer, [make_server(["ok"])])
    with pytest.raises(ValueError, match="empty batch"):
        manager.generate_sequences(batch(n=0))


def test_a_prompt_longer_than_prompt_length_is_a_clear_error(tmp_path, tokenizer, make_server):
    config = rollout_config(tmp_path)
    config.prompt_length = 8
    config.multi_turn.tool_config_path = None
    manager = AgentLoopManager(config, tokenizer, [make_server(["ok"])])
    with pytest.raises(ValueError, match=r"prompt_length=8; raise data.max_prompt_length"):
        manager.generate_sequences(batch(n=1))


def test_missing_lengths_and_bad_tool_configs_fail_at_start_up(tmp_path, tokenizer, make_server):
    with pytest.raises(ValueError, match=r"rollout.response_length=None must be a positive int"):
        AgentLoopManager(RolloutConfig(prompt_length=8), tokenizer, [make_server(["ok"])])
    config = rollout_config(tmp_path, tools=False)
    bad = tmp_path / "bad.yaml"
    bad.write_text("tools:\n  - class_name: calculater\n")
    config.multi_turn.tool_config_path = str(bad)
    with pytest.raises(
        ValueError, match=r"class_name='calculater'.*\['calculator', 'image_zoom', 'python', 'search'\]"
    ):
        AgentLoopManager(config, tokenizer, [make_server(["ok"])])


class EchoPromptLoop(AgentLoopBase):
    """A loop from a YAML registration: answers with the prompt's last token, twice."""

    async def run(self, sampling_params, **kwargs):
        data = AgentData(request_id=kwargs["request_id"], messages=[])
        data.prompt_ids = [5, 6, 7]
        data.append_model_tokens([7, 7], [-0.5, -0.5])
        return data.to_output(self.response_length)


def test_agent_loops_listed_in_a_yaml_file_are_registered(tmp_path, tokenizer, make_server):
    path = tmp_path / "loops.yaml"
    path.write_text(
        textwrap.dedent(f"""
        agent_loops:
          - name: echo_prompt_agent
            _target_: {__name__}.EchoPromptLoop
        """)
    )
    config = rollout_config(tmp_path, tools=False)
    config.agent.agent_loop_config_path = str(path)
    manager = AgentLoopManager(config, tokenizer, [make_server(["unused"])])
    assert "echo_prompt_agent" in registered_agent_loops()
    out = manager.generate_sequences(batch(["echo_prompt_agent"], n=1))
    assert out.batch[F.RESPONSES][0, :2].tolist() == [7, 7]
    assert np.array_equal(out.batch[F.PROMPTS][0, -3:].numpy(), [5, 6, 7])


def test_a_batch_seed_gives_each_row_and_each_turn_its_own_reproducible_seed(
    tmp_path, tokenizer, make_server, call_text
):
    def seeds_of_a_run(seed):
        server = make_server([call_text("calculator", expression="1 + 1"), "2"])
        manager = AgentLoopManager(rollout_config(tmp_path, response_length=256), tokenizer, [server])
        manager.generate_sequences(batch(["tool_agent"] * 2, n=2, seed=seed))
        return sorted((call["params"].seed for call in server.calls), key=str)

    first = seeds_of_a_run(seed=3)
    assert len(first) == 4 and len(set(first)) == 4  # 2 rows x 2 turns, all different
    assert seeds_of_a_run(seed=3) == first
    assert seeds_of_a_run(seed=4) != first
    assert seeds_of_a_run(seed=None) == [None] * 4


class TurnVersionedServer:
    """A scripted server whose turn k is sampled by policy version k, as if weights were loaded between turns."""

    def __init__(self, inner) -> None:
        self.inner = inner

    async def generate(self, request_id, prompt_ids, sampling_params):
        turn = self.inner.turns.get(request_id, 0)
        out = await self.inner.generate(request_id, prompt_ids, sampling_params)
        return dataclasses.replace(out, policy_versions=[turn] * len(out.token_ids))


def test_each_model_token_keeps_the_policy_version_that_sampled_it_and_context_tokens_have_none(
    tmp_path, tokenizer, make_server, call_text
):
    server = TurnVersionedServer(make_server([call_text("calculator", expression="1 + 1"), "2"]))
    manager = AgentLoopManager(rollout_config(tmp_path), tokenizer, [server])
    out = manager.generate_sequences(batch(["tool_agent"], n=1))
    versions, mask = out.batch[F.ROLLOUT_POLICY_VERSIONS][0], out.batch[F.RESPONSE_MASK][0].bool()
    valid = out.batch[F.ATTENTION_MASK][0, 384:].bool()
    model = versions[mask].tolist()
    first_turn = model.count(0)
    assert model == [0] * first_turn + [1] * (len(model) - first_turn) and 0 < first_turn < len(model)
    assert versions[valid & ~mask].eq(-1).all() and versions[~valid].eq(-1).all()  # tool tokens, padding
    assert out.non_tensor_batch[F.ROLLOUT_POLICY_VERSION_MIN][0] == 0
    assert out.non_tensor_batch[F.ROLLOUT_POLICY_VERSION_MAX][0] == 1


def test_the_background_loop_serves_batches_from_several_threads_and_submitted_groups(tmp_path, tokenizer, make_server):
    import concurrent.futures

    server = make_server(lambda prompt, turn: "x" * prompt.count("q"))
    manager = AgentLoopManager(rollout_config(tmp_path, tools=False), tokenizer, [server])
    direct = manager.generate_sequences(batch())
    manager.start_background_loop()
    try:
        submitted = manager.submit(manager.agenerate_sequences(batch())).result(timeout=30)
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as threads:
            from_threads = list(threads.map(lambda _: manager.generate_sequences(batch()), range(2)))
    finally:
        manager.stop_background_loop()
    for out in (submitted, *from_threads):
        assert torch.equal(out.batch[F.RESPONSES], direct.batch[F.RESPONSES])
    assert manager.router.active == [0]  # every conversation released, whichever thread asked
    with pytest.raises(RuntimeError, match="start_background_loop"):
        manager.submit(manager.agenerate_sequences(batch()))


def test_batch_metrics_give_the_batch_mean_of_each_tool_hook_failure_that_occurred():
    failures = [{"execute/timeout": 2, "release/raised": 1}, {}, {"execute/timeout": 1}]
    metrics = batch_metrics(
        [AgentLoopOutput([1], [], [], [], 1, "stop", metrics=AgentLoopMetrics(tool_hook_failures=f)) for f in failures]
    )
    prefix = "agent/tool_hook_failures/"
    assert sorted(key for key in metrics if key.startswith(prefix)) == [
        f"{prefix}execute/timeout/mean",
        f"{prefix}release/raised/mean",
    ]
    assert metrics[f"{prefix}execute/timeout/mean"] == 1.0
    assert metrics[f"{prefix}release/raised/mean"] == pytest.approx(1 / 3)
    assert metrics["agent/num_abandoned_tool_threads/mean"] == 0.0
