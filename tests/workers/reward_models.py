"""A tiny reward model folder with its own tokenizer (a vocabulary unlike the policy's), and a batch of
conversations for it: shared by the reward-model worker's tests on one rank and on two."""

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification

from hyflow.config.reward import RewardModelConfig
from hyflow.models.tiny import build_tiny_tokenizer
from hyflow.protocol import DataProto

PROMPT_LEN, RESPONSE_LEN = 16, 12
CHATS = [
    [{"role": "user", "content": "Compute 1 + 2."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Compute 30 - 4."}],
    [{"role": "user", "content": "Say hi."}],
    [{"role": "user", "content": "Name a colour."}],
]
RESPONSES = ["<answer>3</answer>", "26", "hello there, how are you doing today my friend", "blue"]


def save_reward_model_folders(root) -> dict:
    """A policy tokenizer folder and a reward model folder (safetensors) whose tokenizer has a different
    vocabulary: {"policy": path, "rm": path, "policy_tokenizer": tokenizer}."""
    policy_tokenizer = build_tiny_tokenizer()
    policy_tokenizer.save_pretrained(root / "policy")
    rm_tokenizer = build_tiny_tokenizer(vocab_size=384)
    assert len(rm_tokenizer) != len(policy_tokenizer)
    config = AutoConfig.for_model(
        "qwen2",
        vocab_size=448,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        num_labels=1,
        pad_token_id=rm_tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(root / "rm")
    rm_tokenizer.save_pretrained(root / "rm")
    return {"policy": str(root / "policy"), "rm": str(root / "rm"), "policy_tokenizer": policy_tokenizer}


def conversation_batch(tokenizer) -> DataProto:
    """The CHATS (left-padded prompts) with the RESPONSES (right-padded), tokenized by the policy's `tokenizer`."""
    rows, pad = len(CHATS), tokenizer.pad_token_id
    prompts = torch.full((rows, PROMPT_LEN), pad)
    responses = torch.full((rows, RESPONSE_LEN), pad)
    attention = torch.zeros(rows, PROMPT_LEN + RESPONSE_LEN, dtype=torch.long)
    for i, (chat, text) in enumerate(zip(CHATS, RESPONSES)):
        prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"][-PROMPT_LEN:]
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:RESPONSE_LEN]
        prompts[i, PROMPT_LEN - len(prompt_ids) :] = torch.tensor(prompt_ids)
        responses[i, : len(ids)] = torch.tensor(ids)
        attention[i, PROMPT_LEN - len(prompt_ids) : PROMPT_LEN + len(ids)] = 1
    return DataProto.from_dict(
        {"prompts": prompts, "responses": responses, "attention_mask": attention},
        {"raw_prompt": list(CHATS)},
    )


def reward_model_config(rm_path: str, policy_path: str, **kwargs) -> RewardModelConfig:
    """`reward_model.*` with the reward model at `rm_path` and the policy's tokenizer at `policy_path`."""
    config = RewardModelConfig(enable=True, **kwargs)
    config.model.path, config.model.input_tokenizer = rm_path, policy_path
    return config
