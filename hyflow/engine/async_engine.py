"""AsyncLLMEngine: many concurrent `await engine.generate(...)` callers share one step loop.

    engine = AsyncLLMEngine(LLMEngine(path))
    output = await engine.generate(prompt_ids, SamplingParams(max_tokens=64), request_id="agent-3-turn-2")
    await engine.abort("agent-3-turn-2")        # the waiting caller gets its partial output, finish_reason "abort"
    async for output in engine.stream(prompt_ids, params):   # the output so far after every step, then the final one
        ...

A caller that is cancelled (a client that disconnected, a timeout) aborts its request in the engine.

Weights that change while requests run (a partial rollout; see LLMEngine.pause):

    await engine.pause()                                 # at the step boundary; callers keep waiting
    await engine.load_weights(named_tensors, policy_version=k + 1)
    await engine.resume()                                # the waiting requests go on under the new weights

The loop runs as an asyncio task on the caller's event loop; each forward step runs in a worker thread so the event
loop stays free for tool calls and HTTP. Requests are added and aborted only between steps (on the loop), so the
scheduler is never touched by two threads at once. The loop sleeps when there is nothing to do.

Streams cost the event loop little: the worker thread takes each stream's output right after the step (and, with
`stream(..., detokenize=True)`, its text, decoded incrementally: detokenizer.py); the loop only hands them over.
A reader that falls behind skips to the latest output: its next chunk carries the tokens of several steps.
The readers (an HTTP server's SSE encoding) run between steps, not during them: every torch call of the step
releases and retakes the GIL, and a busy event loop would hold it for up to a switch interval (5 ms) each time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from hyflow.engine.config import SamplingParams
from hyflow.engine.detokenizer import IncrementalDetokenizer
from hyflow.engine.engine import LLMEngine
from hyflow.engine.sequence import RequestOutput

logger = logging.getLogger(__name__)


@dataclass
class _Stream:
    """A streaming request's latest output (outputs are cumulative, so a slow reader only skips intermediate ones)."""

    latest: RequestOutput | None = None
    error: BaseException | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    num_tokens: int = 0  # tokens in the last output taken (worker thread), to publish only outputs that grew
    detokenizers: dict[int, IncrementalDetokenizer] | None = None  # per sample index, with detokenize=True


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._futures: dict[str, asyncio.Future[RequestOutput]] = {}
        self._streams: dict[str, _Stream] = {}
        self._wakeup: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_task: asyncio.Task | None = None
        self._step_lock: asyncio.Lock | None = None
        self._next_id = 0

    def _ensure_loop(self) -> asyncio.Lock:
        """Starts the step loop on the running event loop (again, if an earlier event loop has ended)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._loop_task is None or self._loop_task.done():
            self._loop, self._wakeup, self._step_lock = loop, asyncio.Event(), asyncio.Lock()
            self._futures = {key: f for key, f in self._futures.items() if f.get_loop() is loop}
            self._loop_task = loop.create_task(self._run())
        return self._step_lock

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams | dict | None = None,
        request_id: str | None = None,
        multi_modal_inputs: dict[str, Any] | None = None,
    ) -> RequestOutput:
        """Generates for one prompt (with its images' processor outputs, see `LLMEngine.add_request`); returns when
        it finishes (or is aborted). Bad input raises ValueError."""
        request_id = await self._add(prompt_token_ids, params, request_id, multi_modal_inputs)
        future = asyncio.get_running_loop().create_future()
        self._futures[request_id] = future
        self._wakeup.set()
        try:
            return await future
        except asyncio.CancelledError:  # the caller went away: free the request's slot and blocks now
            await self._abort_quietly(request_id)
            raise

    async def stream(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams | dict | None = None,
        request_id: str | None = None,
        multi_modal_inputs: dict[str, Any] | None = None,
        detokenize: bool = False,
    ) -> AsyncIterator[RequestOutput]:
        """Generates for one prompt, yielding its output so far after every step that added tokens (token ids and
        log-probs, finish_reason None while running; no text, or with `detokenize` the text so far, a prefix of the
        final one), and last the final output (with text). Closing the iterator early (or cancelling its reader)
        aborts the request."""
        request_id = await self._add(prompt_token_ids, params, request_id, multi_modal_inputs)
        stream = self._streams[request_id] = _Stream()
        if detokenize:
            stream.detokenizers = {}
        self._wakeup.set()
        try:
            while True:
                await stream.changed.wait()
                stream.changed.clear()
                if stream.error is not None:
                    raise stream.error
                output = stream.latest
                yield output
                if output.finished:
                    return
        finally:
            if self._streams.pop(request_id, None) is not None:
                await self._abort_quietly(request_id)

    async def _add(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams | dict | None,
        request_id: str | None,
        multi_modal_inputs: dict[str, Any] | None = None,
    ) -> str:
        if self.engine.tp.size > 1:
            # Requests would reach the ranks of a TP group in different orders, so their schedulers would disagree.
            raise ValueError(
                f"the async per-request API (agent loops, serve) does not support tensor_model_parallel_size="
                f"{self.engine.tp.size}: the ranks of a TP group must see the same requests in the same order. "
                "Use the batch API (generate_sequences), or set tensor_model_parallel_size=1 for agent loops."
            )
        lock = self._ensure_loop()
        if request_id is None:
            request_id, self._next_id = f"async-{self._next_id}", self._next_id + 1
        async with lock:  # never add while a step runs in the worker thread
            return self.engine.add_request(prompt_token_ids, params, request_id, multi_modal_inputs)

    async def abort(self, request_id: str) -> None:
        """Ends a request now; its caller receives the partial output with finish_reason "abort"."""
        async with self._ensure_loop():
            output = self.engine.abort(request_id)
        if output is not None:
            self._deliver(output)

    async def _abort_quietly(self, request_id: str) -> None:
        """Aborts a request whose caller is gone, shielded: the abort must happen even while that caller is being
        cancelled."""
        self._futures.pop(request_id, None)
        self._streams.pop(request_id, None)
        await asyncio.shield(self.abort(request_id))

    def _deliver(self, output: RequestOutput) -> None:
        """Hands a finished (or aborted) request's output to its waiting caller or stream."""
        future = self._futures.pop(output.request_id, None)
        if future is not None and not future.done():
            future.set_result(output)
        stream = self._streams.pop(output.request_id, None)
        if stream is not None:
            stream.latest = output
            stream.changed.set()

    def _step(self, streams: list[tuple[str, _Stream]]) -> tuple[list[RequestOutput], list[tuple[_Stream, Any]]]:
        """In the worker thread: one engine step, then the output so far of each of `streams` that gained tokens
        (with its text when the stream decodes). Returns the finished requests and (stream, output) pairs."""
        finished = self.engine.step()
        grown = []
        for request_id, stream in streams:
            output = self.engine.snapshot(request_id)
            num_tokens = 0 if output is None else sum(len(out.token_ids) for out in output.outputs)
            if output is None or num_tokens <= stream.num_tokens:
                continue
            stream.num_tokens = num_tokens
            if stream.detokenizers is not None:
                for out in output.outputs:
                    detokenizer = stream.detokenizers.get(out.index)
                    if detokenizer is None:
                        detokenizer = stream.detokenizers[out.index] = IncrementalDetokenizer(self.engine.tokenizer)
                    out.text = detokenizer.update(out.token_ids)
            grown.append((stream, output))
        return finished, grown

    def _publish(self, grown: list[tuple[_Stream, RequestOutput]]) -> None:
        """Hands outputs so far to their streams (a stream that has ended meanwhile keeps its final output)."""
        for stream, output in grown:
            if stream.latest is None or not stream.latest.finished:
                stream.latest = output
                stream.changed.set()

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            while self.engine.has_unfinished_requests() and not self.engine.paused:
                async with self._step_lock:
                    streams = list(self._streams.items())
                    try:
                        finished, grown = await self._loop.run_in_executor(None, self._step, streams)
                    except Exception as error:  # a failing step must not leave callers waiting forever
                        logger.exception("engine step failed; failing the %d waiting requests", len(self._futures))
                        self._fail_all(error)
                        break
                for output in finished:
                    self._deliver(output)
                self._publish(grown)  # the readers run now, between steps (see the module docstring)
                await asyncio.sleep(0)  # let new requests and aborts in between steps
            self._wakeup.clear()

    def _fail_all(self, error: Exception) -> None:
        for request_id, future in list(self._futures.items()):
            self.engine.abort(request_id)
            if not future.done():
                future.set_exception(error)
        for request_id, stream in list(self._streams.items()):
            self.engine.abort(request_id)
            stream.error = error
            stream.changed.set()
        self._futures.clear()
        self._streams.clear()

    @property
    def has_requests(self) -> bool:
        """Whether any request submitted here (a `generate` or a `stream`) is still running."""
        return bool(self._futures or self._streams)

    async def pause(self) -> None:
        """Stops the step loop at the next step boundary (LLMEngine.pause): waiting callers keep waiting, new
        requests queue up, aborts still answer with the partial output."""
        async with self._ensure_loop():
            await asyncio.to_thread(self.engine.pause)  # waits for the device to finish a batch queued ahead

    async def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], policy_version: int | None = None) -> int:
        """LLMEngine.load_weights between two steps, in a worker thread (the event loop keeps serving tool calls
        meanwhile). Without `pause()` first the step loop waits for it and then goes on by itself."""
        async with self._ensure_loop():
            return await asyncio.to_thread(self.engine.load_weights, weights, policy_version)

    async def resume(self) -> None:
        """Restarts the step loop after `pause()`."""
        async with self._ensure_loop():
            self.engine.resume()
        self._wakeup.set()

    async def sleep(self) -> None:
        """Frees the KV cache between steps (see LLMEngine.sleep)."""
        async with self._ensure_loop():
            self.engine.sleep()

    async def wake(self) -> None:
        async with self._ensure_loop():
            self.engine.wake()
