"""Loading policies, critics and tokenizers from local folders, with clear errors for anything else."""

import json
import os
import shutil

import pytest
import torch

from hyflow.models.loader import check_local_model_folder, load_causal_lm, load_tokenizer, load_value_model
from hyflow.models.tiny import build_tiny_model


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("loader") / "m", hidden_size=32)


def test_a_path_that_is_not_a_local_folder_says_nothing_downloads(tmp_path):
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.model\.path='Qwen/Qwen2-0\.5B'.*downloads nothing"):
        load_causal_lm("Qwen/Qwen2-0.5B")
    with pytest.raises(ValueError, match=r"critic\.model\.path"):
        load_value_model(tmp_path / "missing")


def test_a_folder_without_config_json_is_rejected(tmp_path):
    with pytest.raises(ValueError, match=r"no config\.json"):
        check_local_model_folder(tmp_path)


def test_policy_loads_in_the_requested_dtype_with_config_overrides(model_path):
    model = load_causal_lm(model_path, dtype=torch.bfloat16, override_config={"attention_dropout": 0.1})
    assert next(model.parameters()).dtype == torch.bfloat16
    assert model.config.attention_dropout == 0.1


def test_an_unknown_override_key_is_an_error_naming_it(model_path):
    with pytest.raises(ValueError, match=r"override_config\.not_a_field"):
        load_causal_lm(model_path, override_config={"not_a_field": 1})


def test_critic_is_the_backbone_plus_a_scalar_head(model_path):
    critic = load_value_model(model_path)
    ids = torch.tensor([[5, 6, 7]])
    values = critic(ids, torch.ones_like(ids), torch.arange(3)[None])
    assert values.shape == (1, 3) and values.dtype == torch.float32
    assert critic.value_head.out_features == 1


def test_an_empty_weights_model_has_every_parameter_on_meta_and_the_loaded_models_buffers_and_settings(model_path):
    loaded = load_causal_lm(model_path, dtype=torch.bfloat16)
    empty = load_causal_lm(model_path, dtype=torch.bfloat16, empty_weights=True)
    assert all(p.device.type == "meta" for p in empty.parameters())
    assert [(n, p.shape, p.dtype) for n, p in empty.named_parameters()] == [
        (n, p.shape, p.dtype) for n, p in loaded.named_parameters()
    ]
    assert empty.lm_head.weight is empty.model.embed_tokens.weight  # tied, as loaded
    buffers = dict(loaded.named_buffers())
    assert buffers  # rotary inv_freq
    for name, buffer in empty.named_buffers():
        assert buffer.device.type == "cpu" and buffer.dtype == buffers[name].dtype
        assert torch.equal(buffer, buffers[name]), name
    assert not empty.training and not loaded.training
    assert empty.generation_config.to_dict() == loaded.generation_config.to_dict()  # the folder's, not a default


def test_tokenizer_without_chat_template_is_an_error_when_one_is_needed(model_path, tmp_path):
    assert load_tokenizer(model_path, require_chat_template=True).chat_template
    folder = tmp_path / "no_template"
    folder.mkdir()
    for name in os.listdir(model_path):
        if name.startswith("tokenizer") or name == "special_tokens_map.json":
            shutil.copy(os.path.join(model_path, name), folder / name)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.pop("chat_template", None)
    config_file.write_text(json.dumps(config))
    assert load_tokenizer(folder).chat_template is None
    with pytest.raises(ValueError, match="no chat template"):
        load_tokenizer(folder, require_chat_template=True)
