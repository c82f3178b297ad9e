"""The tool-call parser's types and registry: `FunctionCall`, `ParsedToolCalls`, the `ToolParser` base class.

The formats live beside it: `hermes` in `hyflow/agent/parsers.py` (the public import path of everything here),
the others in `hyflow/agent/parser_formats.py`; both import this module, never each other.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from hyflow.agent.tools.schemas import OpenAIFunctionToolSchema


@dataclass
class FunctionCall:
    """One call the model asked for: the tool's name, its arguments as JSON text, the model's id for the call."""

    name: str
    arguments: str = "{}"
    tool_call_id: str | None = None

    @classmethod
    def of(cls, name: str, arguments: dict[str, Any], tool_call_id: str | None = None) -> FunctionCall:
        """A call from decoded arguments."""
        return cls(name, json.dumps(arguments, ensure_ascii=False), tool_call_id)

    def arguments_dict(self) -> dict[str, Any]:
        """The arguments decoded; a ValueError names the call when they are not the JSON text of an object."""
        try:
            arguments = json.loads(self.arguments)
        except (json.JSONDecodeError, TypeError) as error:
            raise ValueError(f"Invalid JSON in arguments for {self.name!r}: {error}") from error
        if not isinstance(arguments, dict):
            raise ValueError(f"Invalid JSON in arguments for {self.name!r}: {self.arguments!r} is not an object")
        return arguments


@dataclass
class ParsedToolCalls:
    """What a parser found in a model turn: the text outside the calls, the well-formed calls, the bad ones."""

    text: str
    calls: list[FunctionCall]
    num_malformed: int = 0


class ToolParser(ABC):
    """Base class of tool-call formats. Subclasses implement `parse(text)`; decoding is shared."""

    _registry: ClassVar[dict[str, type[ToolParser]]] = {}
    keep_special_tokens: ClassVar[bool] = False  # formats whose markers are special tokens (Kimi K2, harmony)

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def register(cls, name: str) -> Callable[[type[ToolParser]], type[ToolParser]]:
        """Class decorator: make a parser available as `multi_turn.format=<name>`."""

        def decorator(subclass: type[ToolParser]) -> type[ToolParser]:
            existing = cls._registry.get(name)
            if existing is not None and existing is not subclass:
                raise ValueError(f"tool parser {name!r} is already registered by {existing.__qualname__}")
            cls._registry[name] = subclass
            return subclass

        return decorator

    @classmethod
    def get(cls, name: str, tokenizer: Any) -> ToolParser:
        """An instance of the parser registered as `name`; a ValueError lists the known names otherwise."""
        if name not in cls._registry:
            raise ValueError(
                f"actor_rollout_ref.rollout.multi_turn.format={name!r} is not a registered tool parser; use one of "
                f"{sorted(cls._registry)} or register yours with @ToolParser.register({name!r})."
            )
        return cls._registry[name](tokenizer)

    @classmethod
    def names(cls) -> list[str]:
        return sorted(cls._registry)

    @classmethod
    def forceable_names(cls) -> list[str]:
        """The registered formats that can start a call for the model (they define `forced_call_prefix`)."""
        return sorted(name for name, parser in cls._registry.items() if parser.can_force())

    @classmethod
    def can_force(cls) -> bool:
        return cls.forced_call_prefix is not ToolParser.forced_call_prefix

    @classmethod
    def label(cls) -> str:
        """The name the format is registered under (the first, for one registered twice), else its class name."""
        return next((name for name, parser in cls._registry.items() if parser is cls), cls.__qualname__)

    def forced_call_prefix(self, name: str | None, num_previous_calls: int = 0) -> str | None:
        """The text an assistant turn is started with so that the model's continuation is a call in this format: a
        call of the tool `name`, or of a tool of the model's choice when None (OpenAI's `tool_choice` naming a
        function, and "required"; `hyflow serve` writes it after the chat template's generation prompt).
        `num_previous_calls`: the calls the conversation already holds (a format that numbers its calls, Kimi K2,
        continues the count). None: the format cannot be forced (the default)."""
        return None

    @abstractmethod
    def parse(self, text: str, tools: list[OpenAIFunctionToolSchema] | None = None) -> ParsedToolCalls:
        """Split decoded model text into plain text and function calls; never raises on bad model output."""

    async def extract_tool_calls(
        self, response_ids: list[int], tools: list[OpenAIFunctionToolSchema] | None = None
    ) -> tuple[str, list[FunctionCall]]:
        """Decode a model turn's token ids and return (text without the calls, the well-formed calls)."""
        text = self.tokenizer.decode(response_ids, skip_special_tokens=not self.keep_special_tokens)
        parsed = self.parse(text, tools)
        return parsed.text, parsed.calls


def decode_arguments(arguments: Any) -> dict[str, Any] | None:
    """Call arguments as a dict: an object, or the JSON text of one (OpenAI style); None when they are neither."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    return arguments if isinstance(arguments, dict) else None


def to_function_call(payload: str) -> FunctionCall | None:
    """A FunctionCall from a JSON `{"name": str, "arguments": object | JSON string}`, or None when malformed."""
    try:
        obj = json.loads(payload)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = decode_arguments(obj.get("arguments", {}))
    return None if arguments is None else FunctionCall.of(obj["name"], arguments)
