"""`single_turn_agent`: one generation per prompt, the default loop (what plain PPO / GRPO rollouts are)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from hyflow.agent.chat import encode_prompt
from hyflow.agent.loop import AgentData, AgentLoopBase, AgentLoopOutput, register_agent_loop
from hyflow.engine.config import SamplingParams


def prompt_ids_of(
    tokenizer: Any, row: dict[str, Any], tools: list[dict] | None = None, template_kwargs: dict[str, Any] | None = None
) -> list[int]:
    """The prompt's token ids: the chat template over `raw_prompt`, else the row's `raw_prompt_ids`."""
    if row.get("raw_prompt") is not None:
        return encode_prompt(tokenizer, list(row["raw_prompt"]), tools, template_kwargs)
    if row.get("raw_prompt_ids") is not None:
        return [int(i) for i in row["raw_prompt_ids"]]
    raise ValueError(
        "agent loop: a sample has neither 'raw_prompt' (chat messages) nor 'raw_prompt_ids'; keep the dataset's "
        "raw prompt in the batch (data.return_raw_chat=True)."
    )


@register_agent_loop("single_turn_agent")
class SingleTurnAgentLoop(AgentLoopBase):
    """Generate one response of at most `response_length` tokens, all of them in the loss. A row with images
    (`multi_modal_inputs`, a vision-language model) generates from the dataset's prompt ids and its images."""

    async def run(self, sampling_params: SamplingParams, **kwargs: Any) -> AgentLoopOutput:
        data = AgentData(request_id=kwargs["request_id"], messages=list(kwargs.get("raw_prompt") or []))
        vision = {}
        if self.context.processor is not None and kwargs.get("multi_modal_inputs"):
            # The dataset's own tokens: the pads of its images are expanded in raw_prompt_ids already.
            data.prompt_ids = [int(i) for i in kwargs["raw_prompt_ids"]]
            data.multi_modal_inputs = dict(kwargs["multi_modal_inputs"])
            vision = {"multi_modal_inputs": data.multi_modal_inputs}
        else:
            data.prompt_ids = prompt_ids_of(self.tokenizer, kwargs, None, self.context.chat_template_kwargs)
        params = dataclasses.replace(sampling_params, max_tokens=self.response_length)
        start = time.perf_counter()
        output = await self.server.generate(data.request_id, data.prompt_ids, params, **vision)
        data.metrics.generate_seconds = time.perf_counter() - start
        data.append_model_tokens(output.token_ids, output.log_probs, output.policy_versions, output.routed_experts)
        data.assistant_turns = 1
        data.finish_reason = output.finish_reason
        return data.to_output(self.response_length)
