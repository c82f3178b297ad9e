"""From an OpenAI request to what the engine takes: prompt token ids and `SamplingParams`, or a `BadRequest`.

The checks OpenAI's semantics need happen here, before anything reaches the engine: the prompt plus `max_tokens`
must fit the context (`max_model_len`; an unset `max_tokens` of a chat request takes what is left), and every
sampling key hyflow does not implement is refused with a message that names it, its value and the fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hyflow.agent.parsers import ToolParser
from hyflow.agent.tools.schemas import OpenAIFunctionToolSchema, request_tool_schemas
from hyflow.engine.config import SamplingParams
from hyflow.serving.errors import BadRequest
from hyflow.serving.schema import ChatCompletionRequest, ChatMessage, CompletionRequest, NamedToolChoice, ToolDef
from hyflow.serving.state import ServerLimits

# Keys accepted only at their neutral value: (key, neutral value, why hyflow does not implement them).
_NEUTRAL_ONLY = [
    ("presence_penalty", 0.0, "the engine's sampler has no penalties"),
    ("frequency_penalty", 0.0, "the engine's sampler has no penalties"),
    ("repetition_penalty", 1.0, "the engine's sampler has no penalties"),
    ("min_p", 0.0, "the engine's sampler filters with top_k and top_p only"),
    ("min_tokens", 0, "the engine does not hold back stop tokens"),
]


def check_unsupported(request: CompletionRequest | ChatCompletionRequest) -> None:
    """Refuses sampling keys hyflow does not implement unless they are at their neutral value."""
    for key, neutral, why in _NEUTRAL_ONLY:
        value = getattr(request, key)
        if value is not None and value != neutral:
            raise BadRequest(
                f"{key}={value!r} is not supported by hyflow serve ({why}); leave it out or set {neutral}", key
            )
    if request.logit_bias:
        raise BadRequest(
            "logit_bias is not supported by hyflow serve (the sampler takes no biases); leave it out", "logit_bias"
        )


def sampling_params(
    request: CompletionRequest | ChatCompletionRequest, max_tokens: int, top_log_probs: int
) -> SamplingParams:
    """The engine's SamplingParams of a checked request."""
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    try:
        return SamplingParams(
            n=request.n,
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            top_k=request.top_k,
            max_tokens=max_tokens,
            stop=stop,
            stop_token_ids=list(request.stop_token_ids or []),
            ignore_eos=request.ignore_eos,
            seed=request.seed,
            top_log_probs=top_log_probs,
        )
    except ValueError as error:
        raise BadRequest(str(error)) from error


def fit_max_tokens(prompt_len: int, max_tokens: int | None, max_model_len: int) -> int:
    """`max_tokens` checked against the context: a 400 naming the limit when prompt + completion do not fit;
    None takes what the context leaves."""
    if prompt_len >= max_model_len:
        raise BadRequest(
            f"This model's maximum context length is {max_model_len} tokens, but the prompt has {prompt_len} "
            "tokens and at least one must be generated. Shorten the prompt.",
            "messages",
        )
    if max_tokens is None:
        return max_model_len - prompt_len
    if prompt_len + max_tokens > max_model_len:
        raise BadRequest(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} for the completion). "
            f"Lower max_tokens to at most {max_model_len - prompt_len} or shorten the prompt.",
            "max_tokens",
        )
    return max_tokens


@dataclass
class CompletionPrompts:
    token_ids: list[list[int]]
    texts: list[str]  # the prompts as text (for `echo`)


def prompt_list(request: CompletionRequest) -> list[str] | list[list[int]]:
    """A completion request's prompts as a list (one prompt, text or token ids, is a list of one)."""
    prompt = request.prompt
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return [prompt]
    return prompt


def _check_token_ids(ids: list[int], vocab_size: int, where: str) -> None:
    bad = [token for token in ids if not 0 <= token < vocab_size]
    if not ids:
        raise BadRequest(f"{where} is an empty list of token ids; give at least one token id", "prompt")
    if bad:
        raise BadRequest(
            f"{where} holds token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}; send the ids the "
            "model's tokenizer gives (POST /tokenize)",
            "prompt",
        )


def completion_prompts(request: CompletionRequest, tokenizer: Any, vocab_size: int) -> CompletionPrompts:
    """The prompts of a completion request (text, token ids, or a list of either) as token ids and text; token ids
    are checked against the vocabulary before they are decoded."""
    prompt = prompt_list(request)
    if not prompt:
        raise BadRequest("'prompt' is empty; give a string, a list of token ids, or a list of either", "prompt")
    ids, texts = [], []
    for index, item in enumerate(prompt):
        if isinstance(item, str):
            ids.append(list(tokenizer.encode(item, add_special_tokens=False)))
            texts.append(item)
        else:
            _check_token_ids(item, vocab_size, "prompt" if request.prompt is item else f"prompt[{index}]")
            ids.append(list(item))
            texts.append(tokenizer.decode(item))
    if request.echo and request.logprobs is not None:
        raise BadRequest(
            "echo=true with logprobs needs the prompt's log-probs, which hyflow's engine does not compute; "
            "leave out one of the two",
            "echo",
        )
    if request.best_of not in (None, request.n):
        raise BadRequest(
            f"best_of={request.best_of} is not supported; leave it out or set it to n={request.n}", "best_of"
        )
    if request.suffix:
        raise BadRequest("suffix (insertion) is not supported by hyflow serve; leave it out", "suffix")
    return CompletionPrompts(ids, texts)


def check_sample_counts(n: int, best_of: int | None, num_prompts: int, limits: ServerLimits) -> None:
    """The server's bounds on how many sequences one request asks for, checked before anything is tokenized or
    built: `n` and `best_of` at most `--max-n`, prompts × n at most `--max-request-sequences`."""
    for key, value in (("n", n), ("best_of", best_of)):
        if value is not None and value > limits.max_n:
            raise BadRequest(
                f"{key}={value} is more samples than this server's limit of {limits.max_n} per prompt; ask for at "
                "most that many, or restart the server with a larger --max-n",
                key,
            )
    if num_prompts * n > limits.max_request_sequences:
        raise BadRequest(
            f"{num_prompts} prompts × n={n} is {num_prompts * n} sequences, more than this server's limit of "
            f"{limits.max_request_sequences} per request; send fewer prompts or a smaller n, or restart the server "
            "with a larger --max-request-sequences",
            "n",
        )


def check_token_budget(n: int, max_tokens: list[int], limits: ServerLimits) -> None:
    """The server's bound on the tokens one request may ask to generate, checked before its sequences are built:
    n × the sum of its prompts' `max_tokens` (an unset chat `max_tokens` counts as what the context leaves) at
    most `--max-request-tokens`."""
    total = n * sum(max_tokens)
    if total > limits.max_request_tokens:
        shown = max_tokens[0] if len(max_tokens) == 1 else f"{sum(max_tokens)} (over {len(max_tokens)} prompts)"
        raise BadRequest(
            f"n={n} × max_tokens={shown} asks for up to {total} generated tokens, more than this server's limit "
            f"of {limits.max_request_tokens} per request; lower n or max_tokens (an unset max_tokens of a chat "
            "request takes what the context leaves), or restart the server with a larger --max-request-tokens",
            "max_tokens",
        )


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as the chat template reads them: text parts joined (a message with images or videos keeps its parts,
    each image as {"type": "image"}, each video as {"type": "video"}), tool-call arguments parsed from JSON."""
    rendered = []
    for index, message in enumerate(messages):
        content = message.content
        if isinstance(content, list) and any(part.type != "text" for part in content):
            content = [_template_part(part) for part in content]
        elif isinstance(content, list):
            content = "\n".join(part.text for part in content)
        entry: dict[str, Any] = {"role": message.role, "content": content or ""}
        if message.name:
            entry["name"] = message.name
        if message.tool_call_id:
            entry["tool_call_id"] = message.tool_call_id
        if message.tool_calls:
            entry["tool_calls"] = [_template_tool_call(call, index) for call in message.tool_calls]
        rendered.append(entry)
    return rendered


def _template_part(part: Any) -> dict[str, Any]:
    if part.type == "text":
        return {"type": "text", "text": part.text}
    return {"type": "image" if part.type == "image_url" else "video"}


def _template_tool_call(call: Any, index: int) -> dict[str, Any]:
    try:
        arguments = json.loads(call.function.arguments or "{}")
    except json.JSONDecodeError as error:
        raise BadRequest(
            f"messages[{index}].tool_calls: the arguments of {call.function.name!r} are not JSON ({error}); "
            "send them as a JSON object in a string",
            "messages",
        ) from error
    return {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": arguments}}


def parser_tools(tools: list[ToolDef]) -> list[OpenAIFunctionToolSchema]:
    """The request's tools as the tool parser reads them (a format such as qwen3_coder types the values it parses
    by the declared parameter types); a 400 naming the tool whose schema is not an object."""
    try:
        return request_tool_schemas([tool.model_dump(exclude_none=True) for tool in tools])
    except ValueError as error:
        raise BadRequest(str(error), "tools") from error


def tool_call_prefix(parser: ToolParser, request: ChatCompletionRequest) -> str:
    """Text the assistant turn is started with to make the model call a tool, in the parser's own format
    (`ToolParser.forced_call_prefix`): `required` opens a call, a named choice also writes the function's name,
    `auto`/`none` nothing. A 400 naming the parser when its format cannot be forced."""
    choice = request.tool_choice
    if choice in (None, "auto", "none"):
        return ""
    name = choice.function.name if isinstance(choice, NamedToolChoice) else None
    previous = sum(len(message.tool_calls or []) for message in request.messages)
    prefix = parser.forced_call_prefix(name, previous)
    if prefix is None:
        shown = "'required'" if name is None else f"naming {name!r}"
        raise BadRequest(
            f"tool_choice {shown} makes the model call a tool by starting its reply with the call, but this "
            f"server's tool parser {type(parser).label()!r} cannot start one (it defines no forced_call_prefix); "
            "send tool_choice='auto' and ask for the tool in the messages, or restart the server with a "
            f"--tool-call-parser that can: {', '.join(ToolParser.forceable_names())}",
            "tool_choice",
        )
    return prefix


def chat_max_tokens(request: ChatCompletionRequest) -> int | None:
    both = request.max_tokens is not None and request.max_completion_tokens is not None
    if both and request.max_tokens != request.max_completion_tokens:
        raise BadRequest("give max_completion_tokens or max_tokens, not two different values", "max_tokens")
    return request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens


def check_tool_parameters(tools: list[ToolDef]) -> None:
    """A function's `parameters` is a JSON schema of type "object" (OpenAI's rule; the chat templates and parsers
    read the properties of an object): any other type is a 400 naming the tool."""
    for index, tool in enumerate(tools):
        parameters = tool.function.parameters
        if parameters is not None and parameters.get("type", "object") != "object":
            raise BadRequest(
                f"tools[{index}].function.parameters of {tool.function.name!r} has type {parameters['type']!r}; a "
                "function's parameters must be a JSON schema of type 'object' (send the value as one property: "
                "{'type': 'object', 'properties': {'items': {'type': 'array'}}})",
                "tools",
            )


def check_chat(request: ChatCompletionRequest, tool_parser_name: str | None) -> None:
    """Chat-only checks: response formats, tools' parameter schemas, and tools without a parser to read the calls."""
    check_tool_parameters(request.tools or [])
    if request.response_format is not None and request.response_format.type != "text":
        raise BadRequest(
            f"response_format={request.response_format.type!r} is not supported (hyflow has no guided decoding); "
            "leave it out or use 'text'",
            "response_format",
        )
    uses_tools = request.tools and request.tool_choice != "none"
    if uses_tools and tool_parser_name is None:
        raise BadRequest(
            "this request has tools, but the server was started without a tool-call parser; restart it with "
            "--tool-call-parser hermes (or another registered parser), or send tool_choice='none'",
            "tools",
        )
    if isinstance(request.tool_choice, NamedToolChoice):
        names = [tool.function.name for tool in request.tools or []]
        if request.tool_choice.function.name not in names:
            raise BadRequest(
                f"tool_choice names {request.tool_choice.function.name!r}, which is not among the tools {names}",
                "tool_choice",
            )
    elif request.tool_choice == "required" and not request.tools:
        raise BadRequest("tool_choice='required' needs at least one tool in 'tools'", "tool_choice")
