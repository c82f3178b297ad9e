"""`tool_agent`: the multi-turn loop with tool calls and simulated users, as an explicit state machine.

    PENDING ─▶ GENERATING ─┬─▶ PROCESSING_TOOLS ─▶ GENERATING ...      (the model called tools)
                           ├─▶ INTERACTING ──────▶ GENERATING ...      (no calls; an interaction replies)
                           └─▶ TERMINATED                              (stop, length, turn limit)

- PENDING: the chat template over the prompt with the active tools' schemas (all tools, or the sample's
  `extra_info["tool_selection"]`); create one instance per active tool with the sample's
  `tools_kwargs[name]["create_kwargs"]`; start the sample's interaction (`interaction_kwargs["name"]`).
- GENERATING: generate at most the remaining response budget; append the tokens with mask 1 and their log-probs;
  end on `response_length` or `max_assistant_turns`; parse the tool calls with the `multi_turn.format` parser
  (given the tools' schemas) and keep the turn as an OpenAI assistant message (text, calls, the model's call ids).
- PROCESSING_TOOLS: run the first `max_parallel_calls` calls concurrently (further ones are dropped and counted),
  each cut off after its tool's `timeout`; a failure (also arguments that are not a JSON object) becomes
  "Error when executing tool: ..." in the conversation; each tool message answers its call's `tool_call_id`;
  responses are cut to `max_tool_response_length` characters on `tool_response_truncate_side`, rendered by the
  chat template and appended with mask 0 (see `hyflow.agent.chat` for why this stays token-consistent).
  A tool's images and videos (`ToolResponse.image` / `.video`, vision-language models) go in front of its text as
  image and video parts: their pad tokens are expanded in the delta and their processor outputs join the episode's
  `multi_modal_inputs`
  (`hyflow.agent.vision`); a response that would overflow `response_length` keeps only its text.
- INTERACTING: the interaction scores the answer (`turn_scores`) and may end the episode; else its reply becomes a
  user message (mask 0), up to `max_user_turns` replies.
With a processor (`context.processor`), the prompt's "<image>" / "<video>" placeholders are filled with the row's
`multi_modal_data` (the dataset's decoded images and videos) and every generation request carries the episode's
`multi_modal_inputs`. Tools with `takes_images = True` get the prompt's images as `create(image_data=...)`.
`release` of every tool instance and `finalize_interaction` always run, also when the episode fails.

Every tool hook (create, execute, calc_reward, release) runs through `hyflow.agent.tools.hook_runner.run_hook`: on a
worker thread and event loop of its own, cut off after the tool's `timeout`, anything it raises (also `SystemExit`)
turned into a `ToolHookError`, counted in `metrics.tool_hook_failures` by hook and kind. A failed `create` leaves the
tool out of service for the episode (its calls answer with the reason); a failed `calc_reward` scores 0.0; a failed
`release` is logged. A hook whose thread does not finish when cancelled is left behind, counted
(`num_abandoned_tool_threads`), and the tool is out of service for the rest of the episode.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import inspect
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from hyflow.agent.chat import encode_prompt, truncate_text
from hyflow.agent.loop import AgentData, AgentLoopBase, AgentLoopOutput, EpisodeEnd, register_agent_loop
from hyflow.agent.parsers import FunctionCall, decode_arguments
from hyflow.agent.tools.base import ToolResponse
from hyflow.agent.tools.hook_runner import HookName, ToolHookError, run_hook
from hyflow.agent.tools.registry import Tool
from hyflow.agent.vision import (
    encode_prompt_with_images,
    expand_tool_images,
    tool_images,
    tool_message,
    tool_videos,
)
from hyflow.engine.config import SamplingParams

logger = logging.getLogger(__name__)

TOOL_ERROR_PREFIX = "Error when executing tool: "


class AgentState(enum.Enum):
    PENDING = "pending"
    GENERATING = "generating"
    PROCESSING_TOOLS = "processing_tools"
    INTERACTING = "interacting"
    TERMINATED = "terminated"


def select_tools(tools: dict[str, Tool], extra_info: dict[str, Any]) -> dict[str, Tool]:
    """The tools a sample may use: all, or those named in `extra_info["tool_selection"]`."""
    selection = extra_info.get("tool_selection")
    if selection is None:
        return dict(tools)
    unknown = sorted(set(selection) - set(tools))
    if unknown:
        raise ValueError(
            f"extra_info.tool_selection={list(selection)!r} names tools {unknown} that the tool config does not "
            f"declare; declared tools: {sorted(tools)}."
        )
    return {name: tools[name] for name in selection}


def answering(messages: list[dict[str, Any]], call_ids: list[str | None]) -> list[dict[str, Any]]:
    """The tool messages with `tool_call_id` set to the id of the call each answers, where the call had one."""
    return [
        {**message, "tool_call_id": id_} if id_ is not None else message for message, id_ in zip(messages, call_ids)
    ]


@register_agent_loop("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    """Multi-turn episodes with tools and interactions (see the module docstring for the states)."""

    async def run(self, sampling_params: SamplingParams, **kwargs: Any) -> AgentLoopOutput:
        extra_info = dict(kwargs.get("extra_info") or {})
        self.sampling_params = sampling_params
        self.tools = select_tools(self.context.tools, extra_info)
        self.tool_schemas = [tool.tool_schema for tool in self.tools.values()]
        self.interaction_kwargs = dict(kwargs.get("interaction_kwargs") or extra_info.get("interaction_kwargs") or {})
        data = AgentData(
            request_id=kwargs["request_id"],
            messages=[dict(message) for message in kwargs["raw_prompt"]],
            tools_kwargs=dict(kwargs.get("tools_kwargs") or {}),
        )
        multi_modal_data = kwargs.get("multi_modal_data") or {}
        if self.context.processor is not None:
            data.image_data = list(multi_modal_data.get("image") or [])
            data.video_data = list(multi_modal_data.get("video") or [])
        handlers = {
            AgentState.PENDING: self._pending,
            AgentState.GENERATING: self._generating,
            AgentState.PROCESSING_TOOLS: self._processing_tools,
            AgentState.INTERACTING: self._interacting,
        }
        state = AgentState.PENDING
        try:
            while state is not AgentState.TERMINATED:
                state = await handlers[state](data)
            await self._collect_tool_scores(data)
        finally:
            await self._release(data)
        return data.to_output(self.response_length)

    # ---- states ---------------------------------------------------------------------------------------------
    async def _pending(self, data: AgentData) -> AgentState:
        schemas = [schema.model_dump(exclude_unset=True, exclude_none=True) for schema in self.tool_schemas]
        processor = self.context.processor
        if processor is None:
            data.prompt_ids = encode_prompt(self.tokenizer, data.messages, schemas, self.context.chat_template_kwargs)
        else:
            data.prompt_ids, data.multi_modal_inputs = encode_prompt_with_images(
                processor, data.messages, data.image_data, data.video_data, schemas, self.context.chat_template_kwargs
            )
        prompt_images = list(data.image_data)
        for name, tool in self.tools.items():
            create_kwargs = dict(data.tools_kwargs.get(name, {}).get("create_kwargs", {}))
            if tool.takes_images:
                create_kwargs.setdefault("image_data", prompt_images)
            try:
                data.tool_instances[name], _ = await self._hook(
                    data, name, "create", partial(tool.create, **create_kwargs)
                )
            except ToolHookError as error:
                data.broken_tools[name] = f"{name} is unavailable in this episode: {error}"
        if self.interaction_kwargs:
            await self._start_interaction(data)
        return AgentState.GENERATING

    async def _generating(self, data: AgentData) -> AgentState:
        budget = self.response_length - len(data.response_ids)
        if budget <= 0:
            return self._end(data, "length")
        seed = self.sampling_params.seed
        if seed is not None:  # a fresh, reproducible seed per assistant turn
            seed = (seed + 7919 * data.assistant_turns) & 0xFFFFFFFF
        params = dataclasses.replace(self.sampling_params, max_tokens=budget, seed=seed)
        start = time.perf_counter()
        vision = {"multi_modal_inputs": data.multi_modal_inputs} if data.multi_modal_inputs else {}
        output = await self.server.generate(data.request_id, data.prompt_ids + data.response_ids, params, **vision)
        data.metrics.generate_seconds += time.perf_counter() - start
        data.append_model_tokens(output.token_ids, output.log_probs, output.policy_versions, output.routed_experts)
        data.assistant_turns += 1
        ended_with_eos = bool(output.token_ids) and output.token_ids[-1] == self.tokenizer.eos_token_id
        data.last_turn_ended_with_eos = ended_with_eos
        content_ids = output.token_ids[:-1] if ended_with_eos else output.token_ids
        content = self.tokenizer.decode(content_ids, skip_special_tokens=False)
        ended = self._turn_end(data, output.finish_reason)
        if ended is not None:
            data.messages.append({"role": "assistant", "content": content})
            return ended
        parsed = self.context.tool_parser.parse(content, self.tool_schemas)
        data.metrics.num_malformed_tool_calls += parsed.num_malformed
        data.tool_calls = parsed.calls if self.tools else []
        data.messages.append(self._build_assistant_message(parsed.text if data.tool_calls else content, data))
        if data.tool_calls:
            return AgentState.PROCESSING_TOOLS
        if data.interaction is not None:
            return AgentState.INTERACTING
        return self._end(data, "stop")

    def _turn_end(self, data: AgentData, finish_reason: str) -> AgentState | None:
        """TERMINATED when the turn just generated ends the episode (abort, length, turn limit), else None."""
        if finish_reason == "abort":
            return self._end(data, "abort")
        if finish_reason == "length" or len(data.response_ids) >= self.response_length:
            return self._end(data, "length")  # the turn was cut (budget or the engine's max_model_len)
        max_turns = self.context.multi_turn.max_assistant_turns
        if max_turns is not None and data.assistant_turns >= max_turns:
            return self._end(data, "max_turns")
        return None

    @property
    def max_parallel_calls(self) -> int:
        """The calls of one turn that run (verl's attribute name)."""
        return self.context.multi_turn.max_parallel_calls

    def _build_assistant_message(self, content: str, data: AgentData) -> dict[str, Any]:
        """The model's turn as an OpenAI chat message: its text and the calls that will run (at most
        `max_parallel_calls`), arguments decoded, each with the model's call id when the format has one."""
        message: dict[str, Any] = {"role": "assistant", "content": content or ""}
        if not data.tool_calls:
            return message
        message["tool_calls"] = []
        for call in data.tool_calls[: self.max_parallel_calls]:
            arguments = decode_arguments(call.arguments)  # a custom parser's broken JSON is shown as written
            function = {"name": call.name, "arguments": call.arguments if arguments is None else arguments}
            entry: dict[str, Any] = {"type": "function", "function": function}
            if call.tool_call_id is not None:
                entry["id"] = call.tool_call_id
            message["tool_calls"].append(entry)
        return message

    async def _processing_tools(self, data: AgentData) -> AgentState:
        multi_turn = self.context.multi_turn
        calls = data.tool_calls[: self.max_parallel_calls]
        data.metrics.num_dropped_tool_calls += len(data.tool_calls) - len(calls)
        start = time.perf_counter()
        responses = await asyncio.gather(*(self._call_tool(data, call) for call in calls))
        data.metrics.tool_seconds += time.perf_counter() - start
        data.metrics.num_tool_calls += len(calls)
        cut = multi_turn.max_tool_response_length
        texts = [truncate_text(r.text or "", cut, multi_turn.tool_response_truncate_side) for r in responses]
        images = [list(r.image or []) for r in responses]
        videos = [list(r.video or []) for r in responses]
        call_ids = [call.tool_call_id for call in calls]
        messages, delta, inputs = self._tool_turn(data, texts, images, videos, call_ids)
        data.messages.extend(messages)
        data.tool_turns += 1
        data.append_context_tokens(delta)
        if inputs:
            flat_images = [image for group in images for image in group]
            data.add_images(flat_images, inputs, [video for group in videos for video in group])
        if len(data.response_ids) >= self.response_length:
            return self._end(data, "length")
        return AgentState.GENERATING

    async def _interacting(self, data: AgentData) -> AgentState:
        assert data.interaction is not None and data.interaction_id is not None
        should_end, reply, reward, _ = await data.interaction.generate_response(data.interaction_id, data.messages)
        data.turn_scores.append(float(reward))
        if should_end:
            return self._end(data, "stop")
        max_user_turns = self.context.multi_turn.max_user_turns
        if max_user_turns is not None and data.user_turns >= max_user_turns:
            return self._end(data, "max_turns")
        message = {"role": "user", "content": reply}
        data.messages.append(message)
        data.user_turns += 1
        data.append_context_tokens(self.context.message_delta.encode([message], data.last_turn_ended_with_eos))
        if len(data.response_ids) >= self.response_length:
            return self._end(data, "length")
        return AgentState.GENERATING

    def _tool_turn(
        self,
        data: AgentData,
        texts: list[str],
        images: list[list[Any]],
        videos: list[list[Any]],
        call_ids: list[str | None],
    ) -> tuple[list[dict[str, Any]], list[int], dict[str, Any]]:
        """(messages, token delta, new images' and videos' processor outputs) of one tool turn, each message
        answering its call's id when the model gave one; its images and videos are dropped when the delta would
        overflow the response budget (the episode ends there, a cut pad block could not train)."""
        encode = self.context.message_delta.encode
        text_only = answering([tool_message(text, 0) for text in texts], call_ids)
        if not any(images) and not any(videos):
            return text_only, encode(text_only, data.last_turn_ended_with_eos), {}
        messages = [tool_message(text, len(im), len(vi)) for text, im, vi in zip(texts, images, videos)]
        messages = answering(messages, call_ids)
        flat_images = [image for group in images for image in group]
        flat_videos = [video for group in videos for video in group]
        delta, inputs = expand_tool_images(
            self.context.processor, encode(messages, data.last_turn_ended_with_eos), flat_images, flat_videos
        )
        if len(data.response_ids) + len(delta) > self.response_length:
            return text_only, encode(text_only, data.last_turn_ended_with_eos), {}
        return messages, delta, inputs

    @staticmethod
    def _end(data: AgentData, reason: EpisodeEnd) -> AgentState:
        data.finish_reason = reason
        return AgentState.TERMINATED

    # ---- tools and interactions -----------------------------------------------------------------------------
    async def _call_tool(self, data: AgentData, call: FunctionCall) -> ToolResponse:
        """Run one call and return its response for the conversation; failures become error text, never raise.
        Without a processor (a text-only model) a tool's images and videos are dropped with a warning."""
        tool = self.tools.get(call.name)
        if tool is None:
            return self._failed(data, f"unknown tool {call.name!r}; available tools: {sorted(self.tools)}")
        if call.name in data.broken_tools:
            return self._failed(data, data.broken_tools[call.name])
        try:
            arguments = call.arguments_dict()
        except ValueError as error:
            return self._failed(data, str(error))
        missing = tool.missing_arguments(arguments)
        if missing:
            return self._failed(data, f"{call.name} is missing required arguments {missing}")
        execute_kwargs = data.tools_kwargs.get(call.name, {}).get("execute_kwargs", {})
        instance_id = data.tool_instances[call.name]
        execute = partial(checked_execute, partial(tool.execute, instance_id, arguments, **execute_kwargs), call.name)
        try:
            response, reward = await self._hook(data, call.name, "execute", execute)
        except ToolHookError as error:  # a tool's bug must not end the batch: the model sees the error instead
            return self._failed(data, str(error))
        data.tool_rewards.append(reward)
        if (response.image or response.video) and self.context.processor is None:
            logger.warning(
                "tool %s returned images or videos, but the model has no processor (text only): dropped", call.name
            )
            return ToolResponse(text=response.text)
        try:
            image, video = tool_images(response.image, call.name), tool_videos(response.video, call.name)
        except ValueError as error:
            return self._failed(data, str(error))
        return ToolResponse(text=response.text, image=image, video=video)

    async def _hook(self, data: AgentData, name: str, hook: HookName, call: Any) -> Any:
        """`call()` of tool `name`'s hook through `run_hook` (bounded by the tool's timeout); a failure is counted
        and re-raised as a ToolHookError; a call left running takes the tool out of service for the episode."""
        try:
            return await run_hook(name, hook, call, self.tools[name].timeout)
        except ToolHookError as error:
            data.metrics.count_hook_failure(hook, error.kind)
            logger.warning("tool %s: %s %s: %s", name, hook, error.kind, error)
            if error.abandoned:
                data.metrics.num_abandoned_tool_threads += 1
                data.broken_tools[name] = (
                    f"{name} is unavailable for the rest of this episode: an earlier call ({error}) is still running"
                )
            raise

    @staticmethod
    def _failed(data: AgentData, reason: str) -> ToolResponse:
        data.metrics.num_failed_tool_calls += 1
        return ToolResponse(text=f"{TOOL_ERROR_PREFIX}{reason}")

    async def _start_interaction(self, data: AgentData) -> None:
        kwargs = dict(self.interaction_kwargs)
        name = kwargs.pop("name", None)
        if name not in self.context.interactions:
            raise ValueError(
                f"interaction_kwargs.name={name!r} is not a configured interaction; configured: "
                f"{sorted(self.context.interactions)} (multi_turn.interaction_config_path)."
            )
        data.interaction = self.context.interactions[name]
        data.interaction_id = await data.interaction.start_interaction(**kwargs)

    async def _collect_tool_scores(self, data: AgentData) -> None:
        """Each tool's episode reward (`calc_reward`), kept as `extra_fields["tool_scores"]`."""
        scores = {}
        for name, instance_id in data.tool_instances.items():
            kwargs = data.tools_kwargs.get(name, {}).get("calc_reward_kwargs", {})
            scores[name] = 0.0  # also when the tool is out of service or its calc_reward fails (counted)
            if name not in data.broken_tools:
                score = partial(as_score, self.tools[name].calc_reward, instance_id, kwargs)
                with contextlib.suppress(ToolHookError):
                    scores[name] = await self._hook(data, name, "calc_reward", score)
        data.extra_fields["tool_scores"] = scores

    async def _release(self, data: AgentData) -> None:
        """Release every tool instance and finalize the interaction, whatever happened before."""
        for name, instance_id in data.tool_instances.items():
            kwargs = data.tools_kwargs.get(name, {}).get("release_kwargs", {})
            with contextlib.suppress(ToolHookError):  # counted and logged by _hook
                await self._hook(data, name, "release", partial(self.tools[name].release, instance_id, **kwargs))
        if data.interaction is not None and data.interaction_id is not None:
            try:
                await data.interaction.finalize_interaction(data.interaction_id)
            except Exception:
                logger.exception("interaction %s failed to finalize", data.interaction.name)


async def checked_execute(execute: Callable[[], Any], name: str) -> tuple[ToolResponse, float]:
    """`execute()`'s (response, step reward), on the hook's worker loop; a return value that is not
    `(ToolResponse, reward, metrics)` is a TypeError naming the tool (the model reads it as the call's error)."""
    value = execute()
    value = await value if inspect.isawaitable(value) else value
    if not (
        isinstance(value, tuple) and len(value) == 3 and all(hasattr(value[0], k) for k in ("text", "image", "video"))
    ):
        raise TypeError(f"tool {name} returned {value!r:.80} from execute; it returns (ToolResponse, reward, metrics)")
    return value[0], float(value[1])


async def as_score(calc_reward: Any, instance_id: str, kwargs: dict[str, Any]) -> float:
    """A `calc_reward` call's score as a float (on the hook's worker loop)."""
    score = calc_reward(instance_id, **kwargs)
    return float(await score if inspect.isawaitable(score) else score)
