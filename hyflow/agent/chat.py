"""Chat-template tokenization for agent loops: the prompt, and each later message as a token *delta*.

Token consistency: the policy is trained on exactly the tokens it generated. An agent loop therefore never
re-tokenizes the whole conversation; it grows one token list:

    prompt_ids   = encode(template(messages, tools, add_generation_prompt=True))
    response_ids = model tokens, appended as generated (mask 1, their log-probs)
                 + tool / user messages, appended as the chat template's *delta* (mask 0, log-prob 0)

The delta of new messages is computed on a fixed two-turn base conversation (system-prompt-prefix trick):

    delta = template(BASE + new, add_generation_prompt=True)[len(template(BASE)):]

so it does not depend on how the model's own turn would re-render. The template closes an assistant turn with a
suffix (ChatML: `<|im_end|>\n`); the model's turn stops at the eos token (`<|im_end|>`), so the part of that suffix
the model did not generate (`\n`) is put in front of the delta. With the assistant messages stored as the decoded
text of their tokens, `decode(prompt_ids + response_ids)` equals `template(all messages)` (up to the closing
suffix of the last turn) — tests/agent/test_chat.py checks this with the tiny tokenizer.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

logger = logging.getLogger(__name__)

Message = dict[str, Any]
TruncateSide = Literal["left", "right", "middle"]
TRUNCATE_SIDES = ("left", "right", "middle")

_BASE_USER = "hyflow-base-user-turn"
_BASE_ASSISTANT = "hyflow-base-assistant-turn"


def render(
    tokenizer: Any,
    messages: list[Message],
    tools: list[dict] | None = None,
    add_generation_prompt: bool = False,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The chat template applied to `messages` (and tool schemas), as text; `template_kwargs` are the template's own
    variables (`data.apply_chat_template_kwargs`, e.g. `enable_thinking`)."""
    return tokenizer.apply_chat_template(
        messages,
        tools=tools or None,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        **(template_kwargs or {}),
    )


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of rendered template text; special tokens are in the text already, so none are added."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def encode_prompt(
    tokenizer: Any,
    messages: list[Message],
    tools: list[dict] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Token ids of the prompt: the template with the generation prompt (the opening of the assistant turn)."""
    return encode_text(tokenizer, render(tokenizer, messages, tools, True, template_kwargs))


class MessageDelta:
    """Tokenizes messages appended after a model turn, consistently with the whole conversation's template.

    Built once per tokenizer (it renders the base conversation twice); `encode(new_messages, ended_with_eos)`
    returns the ids to append after the model's last token. `template_kwargs`: the template's own variables, as
    the prompt was rendered with (e.g. `enable_thinking=False` opens each new turn with an empty think block).
    """

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        base = [{"role": "user", "content": _BASE_USER}, {"role": "assistant", "content": _BASE_ASSISTANT}]
        self._base = base
        self._base_text = render(tokenizer, base, template_kwargs=self.template_kwargs)
        # What the template writes after an assistant message's content (ChatML: "<|im_end|>\n").
        self.assistant_suffix = self._base_text.split(_BASE_ASSISTANT, 1)[1]
        eos = tokenizer.eos_token or ""
        if eos and self.assistant_suffix.startswith(eos):
            self._after_eos = self.assistant_suffix[len(eos) :]
        else:
            self._after_eos = self.assistant_suffix
            logger.warning(
                "chat template closes an assistant turn with %r, which does not start with eos %r; messages "
                "after a model turn will follow the full suffix",
                self.assistant_suffix,
                eos,
            )

    def text(self, new_messages: list[Message], ended_with_eos: bool) -> str:
        """The text to append after the model's turn: the rest of its closing suffix, then the new messages."""
        full = render(self.tokenizer, self._base + list(new_messages), None, True, self.template_kwargs)
        if not full.startswith(self._base_text):
            raise ValueError(
                "the tokenizer's chat template renders a conversation differently once messages are added to it, "
                "so multi-turn responses cannot be tokenized incrementally; use a template whose output for "
                "messages[:k] is a prefix of its output for messages (true of ChatML / Qwen / Llama-3 templates)."
            )
        closing = self._after_eos if ended_with_eos else self.assistant_suffix
        return closing + full[len(self._base_text) :]

    def encode(self, new_messages: list[Message], ended_with_eos: bool) -> list[int]:
        """Token ids of `text(new_messages, ended_with_eos)`."""
        return encode_text(self.tokenizer, self.text(new_messages, ended_with_eos))


def truncate_text(text: str, max_chars: int, side: TruncateSide) -> str:
    """Keep at most `max_chars` characters of a tool response.

    The side names the part that is cut, as in verl 0.8 and later: `left` keeps the end, `right` keeps the
    beginning, `middle` keeps both ends (verl 0.7 read `left` and `right` the other way round); a marker says
    where the cut is.
    """
    if side not in TRUNCATE_SIDES:
        raise ValueError(
            f"actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side={side!r} is not allowed; "
            f"use one of {list(TRUNCATE_SIDES)}."
        )
    if len(text) <= max_chars:
        return text
    if side == "left":
        return "(truncated)..." + text[len(text) - max_chars :]
    if side == "right":
        return text[:max_chars] + "...(truncated)"
    head = max_chars // 2
    tail = max_chars - head
    return text[:head] + "\n...(truncated)...\n" + (text[len(text) - tail :] if tail else "")
