"""`apply_fused_kernels` swaps in the fused ops without changing what a Hugging Face model computes."""

import copy

import pytest
import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from hyflow.models.kernels import apply_fused_kernels, patch
from hyflow.models.lora import apply_lora
from hyflow.workers.builders import enable_gradient_checkpointing

NUM_LAYERS = 2


def tiny_causal_lm(arch: str) -> nn.Module:
    """A ~50K-parameter model of `arch` with non-trivial RMSNorm weights (HF initialises them to ones)."""
    config = AutoConfig.for_model(
        arch,
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.2)
    return model


def loss_and_grads(model: nn.Module, input_ids: torch.Tensor):
    logits = model(input_ids=input_ids).logits
    loss = torch.log_softmax(logits.float(), dim=-1)[..., 1:, :].gather(-1, input_ids[:, 1:, None]).mean()
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in trainable])
    return logits, {name: grad for (name, _), grad in zip(trainable, grads, strict=True)}


def assert_same_outputs(model: nn.Module, fused: nn.Module):
    input_ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(0))
    logits, grads = loss_and_grads(model, input_ids)
    fused_logits, fused_grads = loss_and_grads(fused, input_ids)
    torch.testing.assert_close(fused_logits, logits, atol=1e-5, rtol=1e-5)
    assert fused_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(fused_grads[name], grad, atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize(
    ("arch", "num_norms"),
    [
        ("qwen2", 2 * NUM_LAYERS + 1),
        ("llama", 2 * NUM_LAYERS + 1),
        ("mistral", 2 * NUM_LAYERS + 1),
        ("qwen3", 4 * NUM_LAYERS + 1),  # + the per-head q_norm and k_norm of each layer
    ],
)
def test_patched_model_computes_the_same_forward_and_backward_as_the_original(arch, num_norms, monkeypatch):
    model = tiny_causal_lm(arch)
    fused = copy.deepcopy(model)
    assert apply_fused_kernels(fused) == num_norms + 2 * NUM_LAYERS  # + one MLP and one attention per layer
    assert fused.state_dict().keys() == model.state_dict().keys()
    calls = count_calls(monkeypatch, "rms_norm", "silu_mul", "rotary")
    assert_same_outputs(model, fused)
    # One forward: each patched module once, the rotary twice per layer (q and k); none from the unpatched model.
    assert calls == {"rms_norm": num_norms, "silu_mul": NUM_LAYERS, "rotary": 2 * NUM_LAYERS}


def count_calls(monkeypatch, *names: str) -> dict[str, int]:
    """Count the patched forwards' calls of the fused ops (they look the ops up in `patch` at call time)."""
    calls = dict.fromkeys(names, 0)
    for name in names:
        original = getattr(patch, name)

        def counted(*args, _name=name, _original=original):
            calls[_name] += 1
            return _original(*args)

        monkeypatch.setattr(patch, name, counted)
    return calls


def test_patched_model_keeps_working_under_lora_and_gradient_checkpointing():
    model = tiny_causal_lm("qwen2")
    fused = copy.deepcopy(model)
    apply_fused_kernels(fused)
    wrapped = []
    for lm in (model, fused):
        enable_gradient_checkpointing(lm)
        torch.manual_seed(1)
        lm = apply_lora(lm, lora_rank=4, lora_alpha=8)
        with torch.no_grad():  # B starts at zero; give the adapters something to do
            for name, param in lm.named_parameters():
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(len(name))) * 0.1)
        wrapped.append(lm.train())
    assert sum(getattr(m, patch.FUSED_MARK, False) for m in wrapped[1].modules()) == 2 * NUM_LAYERS + 1 + 2 * NUM_LAYERS
    assert_same_outputs(*wrapped)


def test_patching_twice_patches_nothing_more():
    model = tiny_causal_lm("llama")
    assert apply_fused_kernels(model) > 0
    assert apply_fused_kernels(model) == 0


class OffsetRMSNorm(nn.Module):
    """Gemma's variant, x / rms(x) ⊙ (1 + w): named like an RMSNorm but another formula."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = 1e-6

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1 + self.weight)


class PlainRMSNorm(OffsetRMSNorm):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def test_only_modules_that_compute_a_plain_rms_norm_are_patched():
    model = nn.Sequential(OffsetRMSNorm(8), PlainRMSNorm(8), nn.LayerNorm(8))
    assert apply_fused_kernels(model) == 1
    assert "forward" not in vars(model[0]) and "forward" in vars(model[1])
