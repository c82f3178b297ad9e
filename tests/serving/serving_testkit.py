"""Test kit of the serving tests: an async engine that replies with a fixed text, for what a random tiny model
cannot be made to write (a well-formed tool call). The server, template, parser and response code stay real."""

from __future__ import annotations

from collections.abc import AsyncIterator

from hyflow.engine.async_engine import AsyncLLMEngine
from hyflow.engine.config import SamplingParams
from hyflow.engine.engine import LLMEngine
from hyflow.engine.sequence import CompletionOutput, RequestOutput


class ScriptedAsyncEngine(AsyncLLMEngine):
    """Every request's reply is the tokens of `reply` (cut at max_tokens); `prompts` records what it was sent."""

    def __init__(self, engine: LLMEngine, reply: str) -> None:
        super().__init__(engine)
        self.reply = reply
        self.prompts: list[list[int]] = []

    def _output(self, prompt: list[int], params: SamplingParams, count: int | None = None) -> RequestOutput:
        tokenizer = self.engine.tokenizer
        ids = tokenizer.encode(self.reply, add_special_tokens=False)[: params.max_tokens]
        final = count is None
        ids = ids if final else ids[:count]
        text = tokenizer.decode(ids, skip_special_tokens=True)  # streamed outputs carry their text so far too
        reason = "stop" if final else None
        outputs = [CompletionOutput(k, ids, [-0.5] * len(ids), reason, None, text) for k in range(params.n)]
        return RequestOutput("scripted", prompt, outputs)

    async def generate(self, prompt_token_ids, params=None, request_id=None, multi_modal_inputs=None) -> RequestOutput:
        self.prompts.append(list(prompt_token_ids))
        return self._output(prompt_token_ids, params)

    async def stream(
        self, prompt_token_ids, params=None, request_id=None, multi_modal_inputs=None, detokenize=False
    ) -> AsyncIterator[RequestOutput]:
        self.prompts.append(list(prompt_token_ids))
        total = len(self.engine.tokenizer.encode(self.reply, add_special_tokens=False))
        for count in range(1, min(total, params.max_tokens), 3):
            yield self._output(prompt_token_ids, params, count)
        yield self._output(prompt_token_ids, params)
