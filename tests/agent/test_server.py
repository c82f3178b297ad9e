"""Generation servers for agent loops: sticky least-loaded routing, and the adapter over hyflow's real engine."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM

from hyflow import fields as F
from hyflow.agent.manager import AgentLoopManager
from hyflow.agent.server import LocalEngineServer, ServerRouter, TokenOutput, WorkerServer
from hyflow.config.actor_rollout_ref import RolloutConfig
from hyflow.controller import WorkerTimeoutError
from hyflow.engine.async_engine import AsyncLLMEngine
from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.engine import LLMEngine
from hyflow.engine.sequence import CompletionOutput
from hyflow.models.tiny import build_tiny_model
from hyflow.protocol import DataProto
from hyflow.rollout.worker_rollout import EngineRollout


class NamedServer:
    def __init__(self, name: str) -> None:
        self.name = name

    async def generate(self, request_id, prompt_ids, sampling_params) -> TokenOutput:
        return TokenOutput([len(prompt_ids)], [-1.0], self.name)


def test_router_sends_new_conversations_to_the_least_loaded_server_and_keeps_them_there():
    router = ServerRouter([NamedServer("a"), NamedServer("b"), NamedServer("c")])
    assert [router.server_index(c) for c in ("x", "y", "z", "w")] == [0, 1, 2, 0]
    router.release("y")
    assert router.server_index("v") == 1  # b has the fewest active conversations now
    assert router.server_index("x") == 0  # later turns stick

    async def turns():
        return [await router.generate("y2", [1, 2], SamplingParams()) for _ in range(3)]

    assert {out.finish_reason for out in asyncio.run(turns())} == {"b"}
    assert router.active == [2, 2, 1]


def test_router_needs_a_server():
    with pytest.raises(ValueError, match="at least one generation server"):
        ServerRouter([])


@pytest.fixture(scope="module")
def tiny_model_path(tmp_path_factory, tokenizer) -> str:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", tokenizer=tokenizer)


class TurnCappedServer:
    """Wraps a real server so that each turn ends after `cap` tokens as if the model had stopped there (a random
    model rarely emits eos); the turn then ends without eos, the case where the template's full suffix follows."""

    def __init__(self, server, cap: int) -> None:
        self.server, self.cap = server, cap

    async def generate(self, request_id, prompt_ids, sampling_params):
        params = dataclasses.replace(sampling_params, max_tokens=min(self.cap, sampling_params.max_tokens))
        output = await self.server.generate(request_id, prompt_ids, params)
        if output.finish_reason == "length" and params.max_tokens < sampling_params.max_tokens:
            output.finish_reason = "stop"
        return output


@pytest.mark.timeout(180)
def test_multi_turn_log_probs_from_the_engine_match_the_model_on_the_final_sequence(
    tmp_path, tokenizer, tiny_model_path
):
    """The trained sequence is the generated one: re-scoring input_ids gives the engine's log-probs at mask 1."""
    interactions = tmp_path / "interactions.yaml"
    interactions.write_text("interaction:\n  - name: answer_check\n    class_name: answer_check\n")
    config = RolloutConfig(prompt_length=32, response_length=40, temperature=1.0, dtype="float32")
    config.multi_turn.interaction_config_path = str(interactions)
    config.multi_turn.max_user_turns = 2
    server = TurnCappedServer(LocalEngineServer(EngineRollout(tiny_model_path, config, tokenizer)), cap=6)
    manager = AgentLoopManager(config, tokenizer, [server])
    kwargs = {"name": "answer_check", "ground_truth": "7", "data_source": "openai/gsm8k"}
    batch = DataProto.from_dict(
        non_tensors={
            F.RAW_PROMPT: [[{"role": "user", "content": "3 + 4 = ?"}], [{"role": "user", "content": "1 + 6?"}]],
            F.AGENT_NAME: ["tool_agent", "single_turn_agent"],
            F.INTERACTION_KWARGS: [kwargs, {}],
        }
    )
    out = manager.generate_sequences(batch)
    mask = out.batch[F.RESPONSE_MASK]
    assert out.non_tensor_batch[F.NUM_TURNS][0] > 2 and 0 < mask[0].sum() < out.batch[F.ATTENTION_MASK][0].sum()

    device = "cuda" if torch.cuda.is_available() else "cpu"  # the engine runs there too
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval().to(device)
    for i in range(2):
        valid = out.batch[F.ATTENTION_MASK][i].bool()
        ids = out.batch[F.INPUT_IDS][i][valid].to(device)
        with torch.no_grad():
            log_probs = torch.log_softmax(model(ids[None]).logits[0, :-1].float(), dim=-1)
        scored = log_probs.gather(-1, ids[1:, None])[:, 0].cpu()
        num_response = int(out.batch[F.ATTENTION_MASK][i, 32:].sum())
        response_scores = scored[-num_response:]
        keep = mask[i, :num_response].bool()
        engine_log_probs = out.batch[F.ROLLOUT_LOG_PROBS][i, :num_response]
        torch.testing.assert_close(response_scores[keep], engine_log_probs[keep], atol=2e-4, rtol=1e-4)


@pytest.mark.timeout(120)
def test_engine_server_gives_token_ids_log_probs_and_finish_reason_of_the_async_engine(tokenizer, tiny_model_path):
    config = EngineConfig(block_size=16, max_model_len=128, max_num_batched_tokens=128, num_kv_blocks=32)
    engine = LLMEngine(tiny_model_path, config, tokenizer=tokenizer)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    prompt = tokenizer.encode("1 + 1 =")
    expected = engine.generate([prompt], params)[0].outputs[0]

    async def twice():
        server = LocalEngineServer(AsyncLLMEngine(engine))
        return [await server.generate("conv", prompt, params) for _ in range(2)]  # same conversation, two turns

    for output in asyncio.run(twice()):
        assert output.token_ids == expected.token_ids and output.finish_reason == "length"
        assert output.log_probs == pytest.approx(expected.log_probs, abs=1e-5)


class FakeActorMethod:
    """Stands in for a Ray actor method: `.remote(...)` returns an awaitable, as an ObjectRef is in asyncio."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def remote(self, prompt_ids, sampling_params, request_id, **vision):
        self.calls.append((prompt_ids, sampling_params, request_id))
        self.vision = vision

        async def result():
            return CompletionOutput(0, [len(prompt_ids), 7], [-0.5, -0.25], "stop")

        return result()


def test_worker_server_calls_the_workers_async_method_once_per_turn_and_converts_its_output():
    handle = type("Handle", (), {"actor_rollout__generate_request": FakeActorMethod()})()
    server = WorkerServer(handle, "actor_rollout__generate_request")

    async def two_turns():
        return [await server.generate("conv", [1, 2, 3], SamplingParams(max_tokens=4)) for _ in range(2)]

    outputs = asyncio.run(two_turns())
    assert outputs[0] == TokenOutput(token_ids=[3, 7], log_probs=[-0.5, -0.25], finish_reason="stop")
    calls = handle.actor_rollout__generate_request.calls
    assert [request_id for _, _, request_id in calls] == ["conv/0", "conv/1"]  # one engine request per turn
    assert calls[0][1].max_tokens == 4


def test_worker_server_sends_a_vision_language_turns_images_to_the_worker():
    """The conversation's processor outputs travel with the turn (Ray pickles the tensors); text turns send none."""
    import torch

    method = FakeActorMethod()
    server = WorkerServer(type("Handle", (), {"generate_request": method})())
    inputs = {"pixel_values": torch.zeros(4, 8), "image_grid_thw": torch.tensor([[1, 2, 2]])}
    asyncio.run(server.generate("conv", [1, 2], SamplingParams(max_tokens=2), multi_modal_inputs=inputs))
    assert method.vision["multi_modal_inputs"] is inputs
    asyncio.run(server.generate("conv", [1, 2], SamplingParams(max_tokens=2)))
    assert method.vision == {}


class SilentActorMethod:
    """A Ray actor method of a worker that stopped: the call never returns."""

    def remote(self, prompt_ids, sampling_params, request_id):
        return asyncio.Event().wait()


def test_worker_server_turns_a_turn_that_never_returns_into_a_timeout_error_naming_the_worker():
    handle = type("Handle", (), {"actor_rollout__generate_request": SilentActorMethod()})()
    server = WorkerServer(handle, "actor_rollout__generate_request", timeout_s=0.05, rank=1, node="10.0.0.2 (b)")

    with pytest.raises(WorkerTimeoutError, match=r"rank 1 on node 10\.0\.0\.2 \(b\)") as caught:
        asyncio.run(server.generate("conv", [1, 2], SamplingParams(max_tokens=4)))
    assert (caught.value.ranks, caught.value.method) == ([1], "actor_rollout__generate_request")
