"""Fused training kernels: Triton on CUDA, the torch reference (same formulas) on CPU.

- `dispatch.py`: `use_triton(tensor)`, when a fused op takes its Triton path
- `functions.py`: `rms_norm`, `silu_mul`, `rotary`, autograd functions with one pass forward and one backward
- `patch.py`: `apply_fused_kernels(model)`, puts them into a Hugging Face model's RMSNorm, MLP and attention
- `triton_lm_head.py`: the LM head's log-prob / entropy kernels used by `hyflow.models.policy`
- `triton_norm_act.py`: the RMSNorm, SiLU-and-mul and rotary kernels

The Triton modules are imported only when a kernel runs, so the package imports without Triton.
"""

from hyflow.models.kernels.dispatch import use_triton
from hyflow.models.kernels.functions import rms_norm, rotary, silu_mul
from hyflow.models.kernels.patch import apply_fused_kernels

__all__ = ["apply_fused_kernels", "rms_norm", "rotary", "silu_mul", "use_triton"]
