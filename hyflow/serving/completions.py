"""`POST /v1/completions`: one or several prompts (text or token ids), `n` samples each; the whole response, or a
stream of chunks. Choice i*n + k is sample k of prompt i."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from hyflow.engine.sequence import CompletionOutput, RequestOutput
from hyflow.serving.generation import Job, generate_all, stream_all
from hyflow.serving.requests import (
    CompletionPrompts,
    check_sample_counts,
    check_token_budget,
    check_unsupported,
    completion_prompts,
    fit_max_tokens,
    prompt_list,
    sampling_params,
)
from hyflow.serving.responses import Envelope, completion_log_probs, token_extras, usage
from hyflow.serving.schema import CompletionRequest
from hyflow.serving.state import ServingState
from hyflow.serving.text import TextStream, cut_at_stop


@dataclass
class _Prepared:
    request: CompletionRequest
    prompts: CompletionPrompts
    jobs: list[Job]
    envelope: Envelope

    @property
    def stops(self) -> list[str]:
        return self.jobs[0][1].stop


def _prepare(state: ServingState, request: CompletionRequest) -> _Prepared:
    check_unsupported(request)
    check_sample_counts(request.n, request.best_of, len(prompt_list(request)), state.limits)
    for text in [request.prompt] if isinstance(request.prompt, str) else request.prompt:
        if isinstance(text, str):
            state.preparer.check_fits(text, "prompt")  # before tokenizing it: a text far past the context is a 400
    prompts = completion_prompts(request, state.tokenizer, state.vocab_size)
    top = request.logprobs or 0
    jobs = []
    for ids in prompts.token_ids:
        max_tokens = fit_max_tokens(len(ids), request.max_tokens, state.max_model_len)
        jobs.append((ids, sampling_params(request, max_tokens, top)))
    check_token_budget(request.n, [params.max_tokens for _, params in jobs], state.limits)
    return _Prepared(request, prompts, jobs, Envelope("text_completion", state.model_name))


def _extras(request: CompletionRequest, prompt_ids: list[int], out: CompletionOutput) -> dict[str, Any]:
    return {**token_extras(out), "prompt_token_ids": prompt_ids} if request.return_token_ids else {}


async def create_completion(state: ServingState, request: CompletionRequest) -> dict[str, Any]:
    prepared = await state.preparer.run(_prepare, state, request)  # off the event loop (preparation.py)
    results = await generate_all(state.async_engine, prepared.jobs, state.metrics)
    choices = []
    for p, result in enumerate(results):
        echo = prepared.prompts.texts[p] if request.echo else ""
        for out in result.outputs:
            text, _ = cut_at_stop(out.text or "", prepared.stops, request.include_stop_str_in_output)
            log_probs = None
            if request.logprobs is not None:
                log_probs = completion_log_probs(state.token_text, out, 0, len(out.token_ids), len(echo))
            choice = {"index": p * request.n + out.index, "text": echo + text, "finish_reason": out.finish_reason}
            choices.append({**choice, "logprobs": log_probs, **_extras(request, result.prompt_token_ids, out)})
    return prepared.envelope.body(choices, _usage(results))


def _usage(results: list[RequestOutput]) -> dict[str, int]:
    prompt = sum(len(r.prompt_token_ids) for r in results)
    return usage(prompt, sum(len(out.token_ids) for r in results for out in r.outputs))


async def stream_completion(state: ServingState, request: CompletionRequest) -> AsyncIterator[dict[str, Any]]:
    """Chunks: each choice's new text (settled: stop strings cut, partial characters held back) with the log-probs
    and ids of its new tokens; its finish_reason in its last chunk; then the usage chunk if asked for."""
    prepared = await state.preparer.run(_prepare, state, request)  # off the event loop (preparation.py)
    streams: dict[int, TextStream] = {}
    sent: dict[int, int] = {}  # tokens sent per choice
    finished: set[int] = set()
    async for p, result in stream_all(state.async_engine, prepared.jobs, state.metrics):
        choices = []
        for out in result.outputs:
            index = p * request.n + out.index
            if index in finished:
                continue
            choice = _stream_choice(state, prepared, p, index, out, streams, sent)
            if choice is not None:
                choices.append(choice)
            if out.finish_reason is not None:
                finished.add(index)
        if choices:
            yield prepared.envelope.body(choices, None, chunk=True)
    options = request.stream_options
    if options is not None and options.include_usage:
        prompt_tokens = sum(len(ids) for ids, _ in prepared.jobs)
        yield prepared.envelope.body([], usage(prompt_tokens, sum(sent.values())), chunk=True)


def _stream_choice(
    state: ServingState,
    prepared: _Prepared,
    prompt: int,
    index: int,
    out: CompletionOutput,
    streams: dict[int, TextStream],
    sent: dict[int, int],
) -> dict[str, Any] | None:
    request, final = prepared.request, out.finish_reason is not None
    first = index not in streams
    stream = streams.setdefault(index, TextStream(prepared.stops, request.include_stop_str_in_output))
    delta = stream.delta(out.text, final)  # the text so far, decoded in the engine's thread (generation.py)
    if first and request.echo:
        delta = prepared.prompts.texts[prompt] + delta
    start, end = sent.get(index, 0), len(out.token_ids)
    if not delta and not final and start == end:
        return None
    sent[index] = end
    log_probs = None
    if request.logprobs is not None:
        log_probs = completion_log_probs(state.token_text, out, start, end)
    choice = {"index": index, "text": delta, "logprobs": log_probs, "finish_reason": out.finish_reason}
    if request.return_token_ids:
        choice["token_ids"] = out.token_ids[start:end]
        if first:
            choice["prompt_token_ids"] = prepared.jobs[prompt][0]
    return choice
