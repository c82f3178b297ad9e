"""LoRA from a saved peft adapter (`model.lora_adapter_path`): the adapter's weights and settings come back."""

import pytest
import torch

from hyflow.models.loader import load_causal_lm
from hyflow.models.lora import adapter_settings, apply_lora, load_lora_adapter
from hyflow.models.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def _saved_adapter(tiny_path, folder):
    lm = apply_lora(load_causal_lm(tiny_path, torch.float32), lora_rank=4, lora_alpha=8, target_modules=["q_proj"])
    torch.manual_seed(0)
    for name, param in lm.named_parameters():
        if "lora_B" in name:
            param.data.normal_()  # a trained adapter: B is no longer zero
    lm.save_pretrained(folder)
    return lm


def test_a_saved_adapter_loads_trainable_with_its_weights(tiny_path, tmp_path):
    saved = _saved_adapter(tiny_path, tmp_path / "adapter")
    ids = torch.tensor([[1, 2, 3, 4]])

    loaded = load_lora_adapter(load_causal_lm(tiny_path, torch.float32), str(tmp_path / "adapter"))

    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, saved(input_ids=ids).logits, atol=1e-5)
    trainable = [name for name, p in loaded.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)


def test_the_adapters_settings_replace_the_model_configs(tiny_path, tmp_path):
    _saved_adapter(tiny_path, tmp_path / "adapter")

    settings = adapter_settings(str(tmp_path / "adapter"))

    assert settings == {"lora_rank": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "exclude_modules": None}


def test_a_folder_without_an_adapter_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"is not a peft adapter folder.*Fix"):
        adapter_settings(str(tmp_path))


@pytest.mark.parametrize("from_adapter", [False, True])
def test_lora_on_an_empty_weights_model_gets_the_adapters_of_a_loaded_model_and_keeps_its_base_on_meta(
    tiny_path, tmp_path, from_adapter
):
    adapter = str(tmp_path / "adapter")
    _saved_adapter(tiny_path, adapter)
    models = []
    for empty in (False, True):
        torch.manual_seed(1)  # a new adapter's A is random
        lm = load_causal_lm(tiny_path, torch.bfloat16, empty_weights=empty)
        models.append(load_lora_adapter(lm, adapter) if from_adapter else apply_lora(lm, lora_rank=4, lora_alpha=8))
    loaded, skeleton = (dict(model.named_parameters()) for model in models)
    assert loaded.keys() == skeleton.keys()
    for name, param in skeleton.items():
        assert param.requires_grad == loaded[name].requires_grad and param.dtype == loaded[name].dtype, name
        if "lora_" in name:
            assert param.device.type == "cpu" and torch.equal(param, loaded[name]), name
        else:
            assert param.device.type == "meta", name
    base = models[1].get_base_model()
    assert base.lm_head.weight is base.model.embed_tokens.weight


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen2_moe"])
def test_all_linear_lora_on_a_moe_model_adapts_its_linear_layers_not_its_routers_or_experts(tmp_path, arch):
    lm = load_causal_lm(build_tiny_model(tmp_path / arch, arch=arch, hidden_size=32))
    model = apply_lora(lm, lora_rank=4, lora_alpha=8, target_modules="all-linear")
    adapted = {name.rsplit(".", 3)[0] for name, _ in model.named_parameters() if ".lora_A." in name}
    assert any(name.endswith("self_attn.q_proj") for name in adapted)
    assert not any(name.endswith(("mlp.gate", "mlp.experts")) for name in adapted)
    if arch == "qwen2_moe":  # its shared expert is a plain MLP
        assert any(name.endswith("shared_expert.up_proj") for name in adapted)
