"""`POST /v1/chat/completions`: messages through the tokenizer's chat template (with the tools), `n` samples;
the whole response, or a stream of chunks.

Tools: with `tool_choice` "auto" (the default when tools are given) the reply's text is read by the server's tool
parser (`--tool-call-parser`, the agent loop's registry), given the request's tools as the agent loop gives its own
(so qwen3_coder's XML values come back as their declared types: `{"n": 3}`, not `{"n": "3"}`); "required" starts
the assistant turn with the opening of a call in the parser's own format and a named choice also with the
function's name (`ToolParser.forced_call_prefix`: hermes' JSON, qwen3_coder's `<function=NAME>`, Kimi K2's call id,
harmony's `to=functions.NAME`), so the model continues a call; a parser that cannot start one makes such a choice a
400. "none" renders no tools and reads none. Formats whose markers are special tokens (Kimi K2, harmony) are read
from the reply's tokens decoded with those tokens kept. A reply with calls has `tool_calls` and finish_reason
"tool_calls". While streaming with tools, the text is held back to the end (a call is only known once it closes)
and sent with the calls.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from hyflow.agent.chat import encode_text, render
from hyflow.agent.tools.schemas import OpenAIFunctionToolSchema
from hyflow.engine.sequence import CompletionOutput
from hyflow.serving.generation import Job, generate_all, stream_all
from hyflow.serving.media import chat_media, check_media_model
from hyflow.serving.requests import (
    BadRequest,
    chat_max_tokens,
    check_chat,
    check_sample_counts,
    check_token_budget,
    check_unsupported,
    fit_max_tokens,
    parser_tools,
    sampling_params,
    template_messages,
    tool_call_prefix,
)
from hyflow.serving.responses import Envelope, ToolCalls, chat_log_probs, chat_message, read_tool_calls, usage
from hyflow.serving.schema import ChatCompletionRequest
from hyflow.serving.state import ServingState
from hyflow.serving.text import TextStream, cut_at_stop


@dataclass
class _Prepared:
    request: ChatCompletionRequest
    job: Job
    images: dict[str, Any] | None  # the processor's outputs of the messages' images and videos (media.py)
    prefix: str  # text the assistant turn was started with (a forced tool call), "" otherwise
    reads_tools: bool
    envelope: Envelope
    tool_schemas: list[OpenAIFunctionToolSchema] | None  # the request's tools, for the parser to type the values

    @property
    def stops(self) -> list[str]:
        return self.job[1].stop


def _prepare(state: ServingState, request: ChatCompletionRequest) -> _Prepared:
    check_unsupported(request)
    check_sample_counts(request.n, None, 1, state.limits)
    parser = state.tool_parser
    check_chat(request, type(parser).__name__ if parser is not None else None)
    if request.top_logprobs and not request.logprobs:
        raise BadRequest("top_logprobs needs logprobs=true", "top_logprobs")
    reads_tools = bool(request.tools) and request.tool_choice != "none"
    tools = [tool.model_dump(exclude_none=True) for tool in request.tools] if reads_tools else None
    tool_schemas = parser_tools(request.tools) if reads_tools else None
    prefix = tool_call_prefix(parser, request) if reads_tools else ""
    check_media_model(state, request.messages)
    try:
        text = render(state.tokenizer, template_messages(request.messages), tools, request.add_generation_prompt)
    except BadRequest:
        raise
    except Exception as error:  # the template's complaint is about the client's messages
        raise BadRequest(f"the chat template rejected the messages: {error}", "messages") from error
    state.preparer.check_fits(text + prefix, "messages")  # before tokenizing it: a text far past the context is a 400
    ids, images = chat_media(state, request, encode_text(state.tokenizer, text + prefix))
    max_tokens = fit_max_tokens(len(ids), chat_max_tokens(request), state.max_model_len)
    check_token_budget(request.n, [max_tokens], state.limits)
    top = (request.top_logprobs or 0) if request.logprobs else 0
    job = (ids, sampling_params(request, max_tokens, top))
    envelope = Envelope("chat.completion", state.model_name)
    return _Prepared(request, job, images, prefix, reads_tools, envelope, tool_schemas)


def _reply(
    state: ServingState, prepared: _Prepared, text: str, out: CompletionOutput
) -> tuple[dict[str, Any], str | None]:
    tools: ToolCalls | None = None
    if prepared.reads_tools:
        parallel = prepared.request.parallel_tool_calls is not False
        tools = read_tool_calls(
            state.tool_parser,
            prepared.prefix + _parser_text(state, prepared, text, out),
            parallel,
            prepared.tool_schemas,
        )
    return chat_message(text, tools)


def _parser_text(state: ServingState, prepared: _Prepared, text: str, out: CompletionOutput) -> str:
    """What the tool parser reads: the reply's text, or for a format whose markers are special tokens (Kimi K2's,
    harmony's: `keep_special_tokens`) the reply's tokens decoded with them kept, as the agent loop decodes them."""
    if not state.tool_parser.keep_special_tokens:
        return text
    kept = state.tokenizer.decode(out.token_ids, skip_special_tokens=False)
    return cut_at_stop(kept, prepared.stops, prepared.request.include_stop_str_in_output)[0]


def _extras(prepared: _Prepared, out: CompletionOutput) -> dict[str, Any]:
    if not prepared.request.return_token_ids:
        return {}
    return {"token_ids": out.token_ids, "token_log_probs": out.log_probs, "prompt_token_ids": prepared.job[0]}


async def create_chat_completion(state: ServingState, request: ChatCompletionRequest) -> dict[str, Any]:
    prepared = await state.preparer.run(_prepare, state, request)  # off the event loop (preparation.py)
    (result,) = await generate_all(state.async_engine, [prepared.job], state.metrics, [prepared.images])
    choices = []
    for out in result.outputs:
        text, _ = cut_at_stop(out.text or "", prepared.stops, request.include_stop_str_in_output)
        message, reason = _reply(state, prepared, text, out)
        log_probs = chat_log_probs(state.token_text, out, 0, len(out.token_ids)) if request.logprobs else None
        choice = {"index": out.index, "message": message, "finish_reason": reason or out.finish_reason}
        choices.append({**choice, "logprobs": log_probs, **_extras(prepared, out)})
    completion_tokens = sum(len(out.token_ids) for out in result.outputs)
    return prepared.envelope.body(choices, usage(len(prepared.job[0]), completion_tokens))


async def stream_chat_completion(state: ServingState, request: ChatCompletionRequest) -> AsyncIterator[dict[str, Any]]:
    """Chunks: the role first, then each choice's settled new text with its tokens' log-probs, the finish_reason
    in its last chunk (with the tool calls, when it has any), then the usage chunk if asked for."""
    prepared = await state.preparer.run(_prepare, state, request)  # off the event loop (preparation.py)
    envelope = prepared.envelope
    streams: dict[int, TextStream] = {}
    sent: dict[int, int] = {}
    yield envelope.body(
        [{"index": k, "delta": {"role": "assistant", "content": ""}, "finish_reason": None} for k in range(request.n)],
        None,
        chunk=True,
    )
    async for _, result in stream_all(state.async_engine, [prepared.job], state.metrics, [prepared.images]):
        choices = []
        for out in result.outputs:
            if out.index in streams and streams[out.index] is None:
                continue  # finished earlier
            choice = _stream_choice(state, prepared, out, streams, sent)
            if choice is not None:
                choices.append(choice)
        if choices:
            yield envelope.body(choices, None, chunk=True)
    options = request.stream_options
    if options is not None and options.include_usage:
        yield envelope.body([], usage(len(prepared.job[0]), sum(sent.values())), chunk=True)


def _stream_choice(
    state: ServingState,
    prepared: _Prepared,
    out: CompletionOutput,
    streams: dict[int, TextStream | None],
    sent: dict[int, int],
) -> dict[str, Any] | None:
    request, final = prepared.request, out.finish_reason is not None
    stream = streams.get(out.index) or TextStream(prepared.stops, request.include_stop_str_in_output)
    streams[out.index] = None if final else stream
    start, end = sent.get(out.index, 0), len(out.token_ids)
    if prepared.reads_tools and not final:
        return None  # held back: a call is only known once it closes (and its tokens' log-probs go with it)
    text = out.text  # the text so far, decoded in the engine's thread (generation.py)
    if prepared.reads_tools:
        full, _ = cut_at_stop(text, prepared.stops, request.include_stop_str_in_output)
        message, reason = _reply(state, prepared, full, out)
        delta = {"content": message["content"]}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        start = 0
    else:
        delta, reason = {"content": stream.delta(text, final)}, None
        if not delta["content"] and not final and start == end:
            return None
    sent[out.index] = end
    log_probs = chat_log_probs(state.token_text, out, start, end) if request.logprobs else None
    choice = {"index": out.index, "delta": delta, "logprobs": log_probs, "finish_reason": reason or out.finish_reason}
    if request.return_token_ids:
        choice["token_ids"] = out.token_ids[start:end]
    return choice
