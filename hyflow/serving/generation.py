"""Running a request's prompts on the async engine: all at once to the end, or as a merged stream of outputs.

Streams ask the engine for their text so far (`detokenize=True`): it is decoded incrementally in the engine's worker
thread, off the event loop. Both map the engine's ValueError (a bad prompt or sampling parameter) to `BadRequest`;
a cancelled caller (client gone, timeout) cancels its engine requests, which aborts them (AsyncLLMEngine).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from hyflow.engine.async_engine import AsyncLLMEngine
from hyflow.engine.config import SamplingParams
from hyflow.engine.sequence import RequestOutput
from hyflow.serving.errors import BadRequest
from hyflow.serving.metrics import ServerMetrics
from hyflow.serving.responses import new_id

Job = tuple[list[int], SamplingParams]
Images = dict[str, Any] | None  # an image or video prompt's processor outputs (media.py)


def _count(metrics: ServerMetrics, output: RequestOutput) -> None:
    metrics.count_tokens(len(output.prompt_token_ids), sum(len(out.token_ids) for out in output.outputs))


async def generate_all(
    engine: AsyncLLMEngine, jobs: list[Job], metrics: ServerMetrics, images: list[Images] | None = None
) -> list[RequestOutput]:
    """The final outputs of every job, in order (`images`: each job's image and video inputs, media.py)."""
    images = images or [None] * len(jobs)
    tasks = [
        asyncio.ensure_future(engine.generate(ids, params, request_id=new_id("req"), multi_modal_inputs=job_images))
        for (ids, params), job_images in zip(jobs, images)
    ]
    try:
        outputs = list(await asyncio.gather(*tasks))
        for output in outputs:
            _count(metrics, output)
        return outputs
    except ValueError as error:
        raise BadRequest(str(error)) from error
    finally:
        for task in tasks:
            task.cancel()  # a no-op for the finished; aborts the others when one failed or the caller is gone


async def stream_all(
    engine: AsyncLLMEngine, jobs: list[Job], metrics: ServerMetrics, images: list[Images] | None = None
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(job index, its output so far) as the engine produces them, merged over the jobs; each job's last item is
    its final output (`output.finished`)."""
    images = images or [None] * len(jobs)
    if len(jobs) == 1:  # the usual case, without the merge
        try:
            stream = engine.stream(*jobs[0], request_id=new_id("req"), multi_modal_inputs=images[0], detokenize=True)
            async for output in stream:
                if output.finished:
                    _count(metrics, output)
                yield 0, output
        except ValueError as error:
            raise BadRequest(str(error)) from error
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, ids: list[int], params: SamplingParams) -> None:
        try:
            request_id, job_images = new_id("req"), images[index]
            stream = engine.stream(ids, params, request_id=request_id, multi_modal_inputs=job_images, detokenize=True)
            async for output in stream:
                queue.put_nowait((index, output))
        except Exception as error:
            queue.put_nowait((index, error))

    tasks = [asyncio.create_task(pump(i, ids, params)) for i, (ids, params) in enumerate(jobs)]
    try:
        remaining = len(jobs)
        while remaining:
            index, item = await queue.get()
            if isinstance(item, ValueError):
                raise BadRequest(str(item)) from item
            if isinstance(item, Exception):
                raise item
            if item.finished:
                remaining -= 1
                _count(metrics, item)
            yield index, item
    finally:
        for task in tasks:
            task.cancel()
