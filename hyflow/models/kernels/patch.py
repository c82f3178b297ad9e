"""Putting the fused ops into a Hugging Face model: `apply_fused_kernels(model) -> int` (modules patched).

    num_patched = apply_fused_kernels(causal_lm)    # before FSDP2 and LoRA; CPU keeps running the torch reference

What it patches, on the module instances (their `forward` attribute), so parameters, names, state dicts, FSDP2's
per-layer wrapping, peft's Linear wrappers and gradient checkpointing all stay as they were:
- RMSNorm: any module whose class is named `*RMSNorm`, with a 1-D `weight` and `variance_epsilon` or `eps`, and
  whose own forward computes x / sqrt(mean(x²) + eps) ⊙ w. That is checked once per class on a small random input,
  so variants such as Gemma's x ⊙ (1 + w) are left alone. Qwen3's per-head q/k norms are RMSNorms over the last
  (head) dim and are patched like the others.
- MLP: any module whose class is named `*MLP`, with `gate_proj`, `up_proj`, `down_proj` and a SiLU `act_fn`
  (Llama, Mistral, Qwen2, Qwen3): down_proj(silu(gate_proj(x)) · up_proj(x)) with the fused SiLU-and-mul.
- Rotary embedding: attention modules (`*Attention` with `q_proj` and `k_proj`) call the module-level function
  `apply_rotary_pos_emb` of their modeling file, so an instance cannot swap it alone. That function is replaced,
  once per modeling file, by a dispatcher that runs the fused rotary only inside the forward of a patched
  attention instance (a context variable the patched forward sets) and otherwise calls the original unchanged;
  it is installed only when the original computes x·cos + rotate_half(x)·sin on a random probe.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import types
from collections import Counter

import torch
from torch import nn

from hyflow.models.kernels.functions import rms_norm, rotary, rotary_reference, silu_mul

logger = logging.getLogger(__name__)

FUSED_MARK = "_hyflow_fused_forward"  # set on patched modules, so patching twice is a no-op
ORIGINAL_ROTARY = "_hyflow_original"  # on an installed rotary dispatcher: the function it replaced
_in_fused_attention = contextvars.ContextVar("hyflow_in_fused_attention", default=False)


def _rms_norm_eps(module: nn.Module) -> float | None:
    for name in ("variance_epsilon", "eps"):
        value = getattr(module, name, None)
        if isinstance(value, float):
            return value
    return None


def _fused_rms_norm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    return rms_norm(hidden_states, self.weight, _rms_norm_eps(self))


def _fused_mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x)))


def _looks_like_rms_norm(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__.endswith("RMSNorm")
        and isinstance(weight, nn.Parameter)
        and weight.dim() == 1
        and _rms_norm_eps(module) is not None
    )


def _computes_plain_rms_norm(module: nn.Module) -> bool:
    """Whether the module's own forward gives x / sqrt(mean(x²) + eps) ⊙ w, on a random fp32 CPU probe (its
    parameters swapped for probe values through `functional_call`, so a module on any device or dtype works)."""
    generator = torch.Generator().manual_seed(0)
    dim = module.weight.shape[0]
    probe_weight = torch.rand(dim, generator=generator) + 0.5
    probe_x = torch.randn(3, dim, generator=generator)
    eps = _rms_norm_eps(module)
    expected = probe_x * torch.rsqrt(probe_x.pow(2).mean(-1, keepdim=True) + eps) * probe_weight
    try:
        with torch.no_grad():
            got = torch.func.functional_call(module, {"weight": probe_weight}, (probe_x,))
    except Exception as error:
        logger.debug("not fusing %s: probing its forward failed (%s)", type(module).__name__, error)
        return False
    return isinstance(got, torch.Tensor) and got.shape == expected.shape and torch.allclose(got, expected, atol=1e-5)


def _is_silu(activation: nn.Module | None) -> bool:
    return isinstance(activation, nn.SiLU) or type(activation).__name__ == "SiLUActivation"


def _looks_like_swiglu_mlp(module: nn.Module) -> bool:
    return (
        type(module).__name__.endswith("MLP")
        and all(isinstance(getattr(module, name, None), nn.Module) for name in ("gate_proj", "up_proj", "down_proj"))
        and _is_silu(getattr(module, "act_fn", None))
    )


def _fused_attention_forward(self: nn.Module, *args, **kwargs):
    """The class's own attention forward, with the fused rotary switched on for its duration."""
    token = _in_fused_attention.set(True)
    try:
        return type(self).forward(self, *args, **kwargs)
    finally:
        _in_fused_attention.reset(token)


def _rotary_dispatcher(original):
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        fusable = (
            _in_fused_attention.get()
            and not args
            and not kwargs
            and q.dim() == k.dim() == 4
            and cos.dim() == 3
            and cos.shape == sin.shape
            and cos.shape[-1] == q.shape[-1] == k.shape[-1]
            and q.shape[-1] % 2 == 0
            and not (cos.requires_grad or sin.requires_grad)  # the fused rotary treats them as constants
        )
        if not fusable:
            return original(q, k, cos, sin, *args, **kwargs)
        return rotary(q, cos, sin), rotary(k, cos, sin)

    setattr(apply_rotary_pos_emb, ORIGINAL_ROTARY, original)
    return apply_rotary_pos_emb


def _computes_plain_rotary(function) -> bool:
    """Whether `function(q, k, cos, sin)` gives q·cos + rotate_half(q)·sin (and the same for k) on a random probe."""
    generator = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 5, 8, generator=generator), torch.randn(2, 1, 5, 8, generator=generator)
    angles = torch.rand(2, 5, 4, generator=generator) * 6
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    try:
        with torch.no_grad():
            got_q, got_k = function(q, k, cos, sin)
    except Exception as error:
        logger.debug("not fusing rotary: probing %s failed (%s)", function, error)
        return False
    want_q, want_k = rotary_reference(q, cos, sin), rotary_reference(k, cos, sin)
    return torch.allclose(got_q, want_q, atol=1e-5) and torch.allclose(got_k, want_k, atol=1e-5)


def _install_rotary_dispatcher(attention: nn.Module) -> bool:
    """Put the dispatcher in place of `apply_rotary_pos_emb` in the attention's modeling file (once); False when
    that file has no such function or it computes something else."""
    named_like_attention = type(attention).__name__.endswith("Attention")
    if not (named_like_attention and hasattr(attention, "q_proj") and hasattr(attention, "k_proj")):
        return False
    modeling = sys.modules.get(type(attention).__module__)
    function = getattr(modeling, "apply_rotary_pos_emb", None)
    if not callable(function):
        return False
    if getattr(function, ORIGINAL_ROTARY, None) is not None:
        return True
    if not _computes_plain_rotary(function):
        return False
    modeling.apply_rotary_pos_emb = _rotary_dispatcher(function)
    return True


def apply_fused_kernels(model: nn.Module) -> int:
    """Swap the forward of every RMSNorm, SwiGLU MLP and rotary attention module of `model` for the fused ops, in
    place; returns how many modules were patched and logs one line naming them. Apply it before FSDP2 and LoRA
    wrap the model."""
    plain_rms_norm_classes: dict[type, bool] = {}
    patched: Counter[str] = Counter()
    for module in model.modules():
        if getattr(module, FUSED_MARK, False):
            continue
        if _looks_like_rms_norm(module):
            cls = type(module)
            if cls not in plain_rms_norm_classes:
                plain_rms_norm_classes[cls] = _computes_plain_rms_norm(module)
            if not plain_rms_norm_classes[cls]:
                continue
            module.forward = types.MethodType(_fused_rms_norm_forward, module)
        elif _looks_like_swiglu_mlp(module):
            module.forward = types.MethodType(_fused_mlp_forward, module)
        elif _install_rotary_dispatcher(module):
            module.forward = types.MethodType(_fused_attention_forward, module)
        else:
            continue
        setattr(module, FUSED_MARK, True)
        patched[type(module).__name__] += 1
    summary = ", ".join(f"{count} {name}" for name, count in sorted(patched.items())) or "nothing"
    logger.info("fused kernels: patched %s (Triton on CUDA, torch reference elsewhere)", summary)
    return sum(patched.values())
