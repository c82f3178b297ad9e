"""The tiny-model kit builds a tokenizer and model folder that Hugging Face loads offline."""

import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hyflow.models.tiny import IM_END, IM_START, PAD, build_tiny_model, build_tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def test_tiny_tokenizer_is_deterministic_and_splits_digits(tokenizer):
    again = build_tiny_tokenizer()
    assert tokenizer.get_vocab() == again.get_vocab()
    digits = [t.lstrip("Ġ") for t in tokenizer.tokenize("12345") if t.lstrip("Ġ")]
    assert digits == ["1", "2", "3", "4", "5"]


def test_tiny_tokenizer_round_trips_text_and_special_tokens(tokenizer):
    text = f"{IM_START}user\nWhat is 17 * 3? Ünïcode too.{IM_END}\n{PAD}"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    assert tokenizer.pad_token == PAD and tokenizer.eos_token == IM_END
    assert tokenizer.pad_token_id != tokenizer.eos_token_id


def test_tiny_chat_template_renders_tools_tool_calls_and_generation_prompt(tokenizer):
    messages = [
        {"role": "user", "content": "add 2 and 3"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}],
        },
        {"role": "tool", "content": "5"},
    ]
    tools = [{"type": "function", "function": {"name": "add", "description": "a+b", "parameters": {}}}]
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert "<tools>" in text and '"name": "add"' in text
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>' in text
    assert "<tool_response>\n5\n</tool_response>" in text
    assert text.endswith(f"{IM_START}assistant\n")
    plain = tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=False)
    assert plain == f"{IM_START}user\nadd 2 and 3{IM_END}\n"


THINKING_TURNS = [
    {"role": "user", "content": "q1"},
    {"role": "assistant", "content": "<think>r1</think>\n\na1"},
    {"role": "user", "content": "q2"},
    {"role": "assistant", "content": "<think>r2</think>a2"},
]


def test_thinking_template_drops_reasoning_of_turns_before_the_last_user_message_only(tmp_path):
    path = build_tiny_model(tmp_path / "thinking", hidden_size=32, thinking_template=True)
    thinking = AutoTokenizer.from_pretrained(path)
    text = thinking.apply_chat_template(THINKING_TURNS, tokenize=False)
    assert f"{IM_START}assistant\na1{IM_END}" in text and "r1" not in text
    assert f"{IM_START}assistant\n<think>r2</think>a2{IM_END}" in text
    prompt = thinking.apply_chat_template(THINKING_TURNS[:1], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith(f"{IM_START}assistant\n")
    no_thinking = thinking.apply_chat_template(
        THINKING_TURNS[:1], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert no_thinking.endswith(f"{IM_START}assistant\n<think>\n\n</think>\n\n")


def test_thinking_template_renders_reasoning_content_of_the_last_turn_as_a_think_block():
    thinking = build_tiny_tokenizer(thinking=True)
    reply = {"role": "assistant", "content": "a1", "reasoning_content": "r1"}
    text = thinking.apply_chat_template([THINKING_TURNS[0], reply], tokenize=False)
    assert text.endswith(f"{IM_START}assistant\n<think>\nr1\n</think>\n\na1{IM_END}\n")


def test_chatml_template_keeps_every_turns_reasoning_as_written(tokenizer):
    text = tokenizer.apply_chat_template(THINKING_TURNS, tokenize=False)
    assert "<think>r1</think>\n\na1" in text and "<think>r2</think>a2" in text


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3", "mistral", "qwen3_moe", "qwen2_moe", "mixtral"])
def test_tiny_model_folder_loads_offline_with_from_pretrained(tmp_path, tokenizer, arch, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = build_tiny_model(tmp_path / arch, arch=arch, tokenizer=tokenizer)
    assert os.path.isfile(os.path.join(path, "config.json"))
    model = AutoModelForCausalLM.from_pretrained(path)
    loaded_tokenizer = AutoTokenizer.from_pretrained(path)
    assert model.config.model_type == arch
    assert model.config.vocab_size >= len(loaded_tokenizer)
    assert loaded_tokenizer.chat_template is not None
    ids = loaded_tokenizer("1 + 1 = 2", return_tensors="pt")["input_ids"]
    assert model(ids).logits.shape == (1, ids.shape[1], model.config.vocab_size)


def test_tiny_model_is_seeded(tmp_path, tokenizer):
    first = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "a", seed=3, tokenizer=tokenizer))
    second = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "b", seed=3, tokenizer=tokenizer))
    for p, q in zip(first.parameters(), second.parameters()):
        assert torch.equal(p, q)


def test_tiny_model_rejects_unknown_arch_naming_the_choices(tmp_path, tokenizer):
    with pytest.raises(ValueError, match=r"arch='gpt2'.*qwen2"):
        build_tiny_model(tmp_path / "x", arch="gpt2", tokenizer=tokenizer)
