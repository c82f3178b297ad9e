"""RewardModelWorker: a tiny sequence classifier with its own tokenizer scores a batch of conversations."""

import sys

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

from hyflow.config.reward import RewardModelConfig
from hyflow.controller import ClassWithInitArgs, LocalWorkerGroup
from hyflow.models.tiny import build_tiny_tokenizer
from hyflow.workers.reward_model import RewardModelScorer, RewardModelWorker

from .reward_models import CHATS, RESPONSE_LEN, conversation_batch, reward_model_config, save_reward_model_folders


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return save_reward_model_folders(tmp_path_factory.mktemp("rm"))


def _config(folders, **kwargs):
    return reward_model_config(folders["rm"], folders["policy"], **kwargs)


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
    data = conversation_batch(folders["policy_tokenizer"])
    group = LocalWorkerGroup(ClassWithInitArgs(RewardModelWorker, config=_config(folders, micro_batch_size_per_gpu=2)))
    group.init_model()
    rm_scores = group.compute_rm_score(data).batch["rm_scores"]
    expected, lengths = _expected_scores(folders, data)
    rows = len(CHATS)
    assert rm_scores.shape == (rows, RESPONSE_LEN)
    assert torch.allclose(rm_scores[torch.arange(rows), lengths - 1], expected, atol=1e-5)
    assert torch.count_nonzero(rm_scores) == rows


def test_micro_batch_size_does_not_change_the_scores(folders):
    data = conversation_batch(folders["policy_tokenizer"])
    one_at_a_time = RewardModelScorer(_config(folders, micro_batch_size_per_gpu=1)).compute_rm_score(data)
    all_at_once = RewardModelScorer(_config(folders)).compute_rm_score(data)
    assert torch.allclose(one_at_a_time.batch["rm_scores"], all_at_once.batch["rm_scores"], atol=1e-5)


def test_max_length_keeps_the_end_of_the_conversation(folders):
    scorer = RewardModelScorer(_config(folders, max_length=8))
    data = conversation_batch(folders["policy_tokenizer"])
    lengths = data.batch["attention_mask"][:, -RESPONSE_LEN:].sum(-1).tolist()
    full = RewardModelScorer(_config(folders)).conversation_ids(data, lengths)
    assert scorer.conversation_ids(data, lengths) == [ids[-8:] for ids in full]


def test_a_batch_without_raw_chat_asks_for_return_raw_chat(folders):
    data = conversation_batch(folders["policy_tokenizer"])
    data.non_tensor_batch.pop("raw_prompt")
    with pytest.raises(ValueError, match=r"data\.return_raw_chat=True"):
        RewardModelScorer(_config(folders)).compute_rm_score(data)


def test_a_missing_reward_model_path_is_a_clear_error():
    with pytest.raises(ValueError, match=r"reward_model\.model\.path is not set"):
        RewardModelScorer(RewardModelConfig(enable=True))


def test_the_reward_models_external_lib_is_imported_before_its_config_is_read(folders, tmp_path, monkeypatch):
    (tmp_path / "my_rm_architectures.py").write_text("REGISTERED = True\n")  # would register a custom architecture
    monkeypatch.syspath_prepend(str(tmp_path))
    config = _config(folders)
    config.model.external_lib = "my_rm_architectures"
    RewardModelScorer(config)
    assert sys.modules["my_rm_architectures"].REGISTERED
    monkeypatch.delitem(sys.modules, "my_rm_architectures")


@pytest.mark.parametrize("num_labels", [None, 1])
def test_a_causal_lm_folder_is_not_taken_for_a_reward_model(folders, tmp_path, num_labels):
    labels = {} if num_labels is None else {"num_labels": num_labels}
    lm_config = AutoConfig.for_model(
        "qwen2", vocab_size=448, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, **labels,
    )  # fmt: skip
    AutoModelForCausalLM.from_config(lm_config).save_pretrained(tmp_path / "lm")
    build_tiny_tokenizer(vocab_size=384).save_pretrained(tmp_path / "lm")
    config = reward_model_config(str(tmp_path / "lm"), folders["policy"])
    expected = r"num_labels=2 \(architectures=\['Qwen2ForCausalLM'\]\)" if num_labels is None else r"score\.weight"
    with pytest.raises(ValueError, match=expected):
        RewardModelScorer(config)
