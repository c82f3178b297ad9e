"""RewardModelWorker: a tiny sequence classifier with its own tokenizer scores a batch of conversations."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification

from hyflow.config.reward import RewardModelConfig
from hyflow.controller import ClassWithInitArgs, LocalWorkerGroup
from hyflow.models.tiny import build_tiny_tokenizer
from hyflow.protocol import DataProto
from hyflow.workers.reward_model import RewardModelScorer, RewardModelWorker

PROMPT_LEN, RESPONSE_LEN = 16, 12
CHATS = [
    [{"role": "user", "content": "Compute 1 + 2."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Compute 30 - 4."}],
    [{"role": "user", "content": "Say hi."}],
]
RESPONSES = ["<answer>3</answer>", "26", "hello there, how are you doing today my friend"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A policy tokenizer folder and a reward model folder whose tokenizer has a different vocabulary."""
    root = tmp_path_factory.mktemp("rm")
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


def _batch(tokenizer):
    pad = tokenizer.pad_token_id
    prompts = torch.full((3, PROMPT_LEN), pad)
    responses = torch.full((3, RESPONSE_LEN), pad)
    attention = torch.zeros(3, PROMPT_LEN + RESPONSE_LEN, dtype=torch.long)
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


def _config(folders, **kwargs):
    config = RewardModelConfig(enable=True, **kwargs)
    config.model.path, config.model.input_tokenizer = folders["rm"], folders["policy"]
    return config


def _expected_scores(folders, data):
    """Score each conversation alone, unpadded: the reference for the batched, left-padded worker."""
    model = AutoModelForSequenceClassification.from_pretrained(folders["rm"]).eval()
    rm_tokenizer = build_tiny_tokenizer(vocab_size=384)
    lengths = data.batch["attention_mask"][:, -RESPONSE_LEN:].sum(-1)
    scores, policy_tokenizer = [], folders["policy_tokenizer"]
    for row, chat in enumerate(CHATS):
        text = policy_tokenizer.decode(data.batch["responses"][row, : lengths[row]], skip_special_tokens=True)
        rendered = rm_tokenizer.apply_chat_template([*chat, {"role": "assistant", "content": text}], tokenize=False)
        ids = torch.tensor([rm_tokenizer(rendered, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            scores.append(model(input_ids=ids).logits[0, 0].item())
    return torch.tensor(scores), lengths


def test_reward_model_worker_scores_a_batch_on_the_last_response_token(folders):
    data = _batch(folders["policy_tokenizer"])
    group = LocalWorkerGroup(ClassWithInitArgs(RewardModelWorker, config=_config(folders, micro_batch_size_per_gpu=2)))
    group.init_model()
    rm_scores = group.compute_rm_score(data).batch["rm_scores"]
    expected, lengths = _expected_scores(folders, data)
    assert rm_scores.shape == (3, RESPONSE_LEN)
    assert torch.allclose(rm_scores[torch.arange(3), lengths - 1], expected, atol=1e-5)
    assert torch.count_nonzero(rm_scores) == 3


def test_micro_batch_size_does_not_change_the_scores(folders):
    data = _batch(folders["policy_tokenizer"])
    one_at_a_time = RewardModelScorer(_config(folders, micro_batch_size_per_gpu=1)).compute_rm_score(data)
    all_at_once = RewardModelScorer(_config(folders)).compute_rm_score(data)
    assert torch.allclose(one_at_a_time.batch["rm_scores"], all_at_once.batch["rm_scores"], atol=1e-5)


def test_max_length_keeps_the_end_of_the_conversation(folders):
    scorer = RewardModelScorer(_config(folders, max_length=8))
    data = _batch(folders["policy_tokenizer"])
    lengths = data.batch["attention_mask"][:, -RESPONSE_LEN:].sum(-1).tolist()
    full = RewardModelScorer(_config(folders)).conversation_ids(data, lengths)
    assert scorer.conversation_ids(data, lengths) == [ids[-8:] for ids in full]


def test_a_batch_without_raw_chat_asks_for_return_raw_chat(folders):
    data = _batch(folders["policy_tokenizer"])
    data.non_tensor_batch.pop("raw_prompt")
    with pytest.raises(ValueError, match=r"data\.return_raw_chat=True"):
        RewardModelScorer(_config(folders)).compute_rm_score(data)


def test_a_missing_reward_model_path_is_a_clear_error():
    with pytest.raises(ValueError, match=r"reward_model\.model\.path is not set"):
        RewardModelScorer(RewardModelConfig(enable=True))
