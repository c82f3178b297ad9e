"""Chat-template tokenization: the incremental response decodes to the template of the whole conversation."""

from __future__ import annotations

import asyncio

import pytest

from hyflow.agent.chat import MessageDelta, encode_prompt, render, truncate_text
from hyflow.agent.interactions.answer_check import AnswerCheckInteraction
from hyflow.agent.tool_agent import ToolAgentLoop
from hyflow.agent.tools.calculator import CalculatorTool
from hyflow.engine.config import SamplingParams

pytestmark = pytest.mark.timeout(60)


def run_episode(context, raw_prompt, **row):
    loop = ToolAgentLoop(context)
    params = SamplingParams(max_tokens=context.response_length)
    return asyncio.run(loop.run(params, request_id="c", raw_prompt=raw_prompt, **row))


def test_incremental_tokens_decode_to_the_chat_template_of_the_whole_conversation(
    tokenizer, make_server, make_context, call_text
):
    script = [
        "Let me compute. " + call_text("calculator", expression="17 * 3"),
        call_text("calculator", expression="51 + 1") + "\n" + call_text("calculator", expression="2 ** 3"),
        "#### 51",
        "#### 52",
    ]
    server = make_server(script)
    interactions = {"answer_check": AnswerCheckInteraction("answer_check")}
    context = make_context(server, tools=[CalculatorTool()], interactions=interactions, max_parallel_calls=2)
    raw_prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "17 * 3 + 1?"}]
    kwargs = {"name": "answer_check", "ground_truth": "52", "data_source": "openai/gsm8k"}
    output = run_episode(context, raw_prompt, interaction_kwargs=kwargs)
    assert output.finish_reason == "stop" and output.num_turns == 8

    messages = list(raw_prompt)
    messages += [{"role": "assistant", "content": script[0]}, {"role": "tool", "content": "51"}]
    messages += [{"role": "assistant", "content": script[1]}]
    messages += [{"role": "tool", "content": "52"}, {"role": "tool", "content": "8"}]
    messages += [{"role": "assistant", "content": "#### 51"}, {"role": "user", "content": "Your answer is incorrect. "}]
    messages[-1]["content"] += "Please check your work and try again."
    messages += [{"role": "assistant", "content": "#### 52"}]
    expected = render(tokenizer, messages, tools=[CalculatorTool.default_schema])
    decoded = tokenizer.decode(output.prompt_ids + output.response_ids, skip_special_tokens=False)
    # the template closes the last turn with "<|im_end|>\n"; the model's turn ends at "<|im_end|>"
    assert decoded + "\n" == expected


def test_prompt_ids_are_the_template_with_the_generation_prompt(tokenizer):
    messages = [{"role": "user", "content": "hi"}]
    ids = encode_prompt(tokenizer, messages)
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_message_delta_adds_only_what_the_model_did_not_generate(tokenizer):
    delta = MessageDelta(tokenizer)
    tool_messages = [{"role": "tool", "content": "42"}]
    after_eos = delta.text(tool_messages, ended_with_eos=True)
    assert after_eos == "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert delta.text(tool_messages, ended_with_eos=False) == "<|im_end|>" + after_eos


def test_message_delta_rejects_a_template_that_rewrites_earlier_turns(tokenizer):
    class RewritingTokenizer:
        eos_token = "</s>"

        def apply_chat_template(self, messages, tools=None, add_generation_prompt=False, tokenize=False):
            return f"{len(messages)} messages: " + "|".join(m["content"] for m in messages) + "</s>"

    with pytest.raises(ValueError, match="cannot be tokenized incrementally"):
        MessageDelta(RewritingTokenizer()).text([{"role": "tool", "content": "1"}], ended_with_eos=True)


@pytest.mark.parametrize(
    ("side", "expected"),
    [("left", "(truncated)...wxyz"), ("right", "abcd...(truncated)"), ("middle", "ab\n...(truncated)...\nyz")],
)
def test_truncate_text_cuts_the_chosen_side_and_keeps_max_chars(side, expected):
    assert truncate_text("abcdefghijklmnopqrstuvwxyz", 4, side) == expected
    assert truncate_text("short", 10, side) == "short"


def test_truncate_text_rejects_an_unknown_side():
    with pytest.raises(ValueError, match=r"tool_response_truncate_side='top'.*\['left', 'right', 'middle'\]"):
        truncate_text("abc", 1, "top")
