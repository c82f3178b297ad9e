"""Routing replay R3 through agent loops: the last turn's routing record, which covers the whole episode (tool tokens
included, prefilled by the engine in that turn), reaches the batch as `routed_experts`, aligned with input_ids."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hyflow import fields as F
from hyflow.agent.manager import AgentLoopManager

from .test_manager import batch, rollout_config

pytestmark = pytest.mark.timeout(60)


class RecordingServer:
    """A scripted server that returns, like the engine with record_routing, one routing row per token it fed
    through the model (prompt and tokens but the last), each row filled with the turn's number."""

    def __init__(self, inner) -> None:
        self.inner = inner

    async def generate(self, request_id, prompt_ids, sampling_params):
        turn = self.inner.turns.get(request_id, 0)
        out = await self.inner.generate(request_id, prompt_ids, sampling_params)
        rows = len(prompt_ids) + len(out.token_ids) - 1
        return dataclasses.replace(out, routed_experts=torch.full((rows, 2, 2), turn, dtype=torch.uint8))


def test_every_token_of_an_episode_but_its_last_carries_the_last_turns_routing(
    tmp_path, tokenizer, make_server, call_text
):
    server = RecordingServer(make_server([call_text("calculator", expression="1 + 1"), "2"]))
    manager = AgentLoopManager(rollout_config(tmp_path), tokenizer, [server])
    out = manager.generate_sequences(batch(["tool_agent"], n=1))
    routed = out.batch[F.ROUTED_EXPERTS][0]
    real = out.batch[F.ATTENTION_MASK][0].bool()
    tool_tokens = real[384:] & ~out.batch[F.RESPONSE_MASK][0].bool()
    assert routed.shape == (out.batch[F.INPUT_IDS].shape[1], 2, 2) and tool_tokens.any()
    last = int(real.nonzero().max())
    assert (routed[real.nonzero().squeeze(1)[:-1]] == 1).all()  # the second turn's record, tool tokens included
    assert (routed[last] == 255).all() and (routed[~real] == 255).all()


def test_a_server_without_routing_gives_no_routed_experts(tmp_path, tokenizer, make_server):
    manager = AgentLoopManager(rollout_config(tmp_path, tools=False), tokenizer, [make_server(["4"])])
    assert F.ROUTED_EXPERTS not in manager.generate_sequences(batch(["single_turn_agent"], n=1)).batch.keys()  # noqa: SIM118
