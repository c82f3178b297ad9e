"""When the fused kernels run: Triton on CUDA tensors, the torch reference everywhere else.

    if use_triton(x): ...          # Triton importable and x on CUDA (or TRITON_INTERPRET=1, see below)

CI and laptops have no Triton and no GPU: there every fused op runs its torch reference, which is also what the
tests compare the kernels with. `TRITON_INTERPRET=1` (set before Python starts) runs the Triton kernels on CPU
tensors through Triton's interpreter: slow, for checking the kernels without a GPU
(`TRITON_INTERPRET=1 python -m pytest tests/models/test_fused_gpu.py`).
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch


def triton_interpreting() -> bool:
    """True when Triton runs its kernels in the CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def triton_available() -> bool:
    """Whether the `triton` package can be imported (it ships with CUDA builds of torch, not CPU ones)."""
    return importlib.util.find_spec("triton") is not None


def use_triton(tensor: torch.Tensor) -> bool:
    """Run the Triton kernel for an op on `tensor`: Triton is there and the tensor is on CUDA (or interpreted)."""
    if not triton_available():
        return False
    return tensor.is_cuda or (triton_interpreting() and tensor.device.type == "cpu")
