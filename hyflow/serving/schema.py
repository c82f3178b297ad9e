"""Pydantic models of the OpenAI API requests `hyflow serve` accepts (the responses are built in responses.py and
checked by the tests against the `openai` client's own types).

Unknown keys are rejected (HTTP 400 naming them), so a parameter hyflow does not implement is never silently
ignored, and values are read strictly: `"stream": "yes"` or `"n": "2"` is a 400, not coerced (an integer where a
number is expected, `"temperature": 0`, is a number). hyflow's extras, next to OpenAI's keys: `top_k`, `min_p`,
`min_tokens`, `repetition_penalty`, `stop_token_ids`, `ignore_eos`, `include_stop_str_in_output`, `return_token_ids`
(the choices then carry `token_ids` and the response `prompt_token_ids`: what RL needs), and for chat
`mm_processor_kwargs` (`fps` of the video parts; the processor's pixel bounds are per server).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class _SamplingRequest(_Strict):
    """The keys both endpoints share."""

    model: str
    n: int = Field(1, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # hyflow / vLLM extras
    top_k: int = Field(-1, lt=2**31)  # above the vocabulary is "off"; a bound keeps it a 32-bit integer
    min_p: float = 0.0
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    return_token_ids: bool = False


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ImageURL(_Strict):
    url: str  # data:image/<format>;base64,<data>, or file:// under --allowed-local-media-path (never the web)
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(_Strict):
    type: Literal["image_url"]
    image_url: ImageURL


class VideoURL(_Strict):
    url: str  # data:video/<format>;base64,<data>, data:image/gif;base64,<data>, or file:// as for images


class VideoPart(_Strict):
    type: Literal["video_url"]
    video_url: VideoURL


ContentPart = Annotated[TextPart | ImagePart | VideoPart, Field(discriminator="type")]


class ProcessorKwargs(_Strict):
    """vLLM's `mm_processor_kwargs` as far as hyflow reads them: `fps`, the frame rate of the request's videos (one
    number for all, or one per video part, in order). `min_pixels` / `max_pixels` are known only to be refused
    with the fix: hyflow sets them per server (`--mm-processor-kwargs`)."""

    fps: float | list[float] | None = None
    min_pixels: int | None = None
    max_pixels: int | None = None


class FunctionCallIn(_Strict):
    name: str
    arguments: str  # a JSON object, as a string (OpenAI's shape)


class ToolCallIn(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    # Fields of a reply that clients send back as they got it (`messages.append(reply.choices[0].message)`).
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: dict[str, Any] | None = None
    function_call: dict[str, Any] | None = None


class FunctionDef(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    add_generation_prompt: bool = True
    mm_processor_kwargs: ProcessorKwargs | None = None  # vLLM's extra: the videos' fps


class TokenizeRequest(_Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = False
    add_generation_prompt: bool = True


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int]
