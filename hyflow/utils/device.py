"""Which accelerator this process has, named as torch and torch.distributed name it: CUDA when present, else CPU.

verl's `verl.utils.device` helpers under the same names, so worker code written against them runs unchanged:

    device = torch.device(get_device_name(), get_device_id())   # cuda:0 on a GPU worker, cpu:0 otherwise
    dist.init_process_group(backend=get_nccl_backend())          # "nccl" with CUDA, "gloo" without
    get_torch_device().synchronize()                             # torch.cuda, or torch.cpu

hyflow runs on CUDA and on CPU (no Ascend NPU support); on a machine without CUDA everything answers for the CPU.
"""

from __future__ import annotations

from types import ModuleType

import torch

__all__ = [
    "get_device_id",
    "get_device_name",
    "get_nccl_backend",
    "get_torch_device",
    "is_cuda_available",
    "is_torch_npu_available",
]


def is_cuda_available() -> bool:
    """Whether this process sees a CUDA device."""
    return torch.cuda.is_available()


def is_torch_npu_available(check_device: bool = True) -> bool:
    """Always False: hyflow has no Ascend NPU backend."""
    return False


def get_device_name() -> str:
    """The torch device type: "cuda" or "cpu"."""
    return "cuda" if is_cuda_available() else "cpu"


def get_torch_device() -> ModuleType:
    """The torch module of that device type (`torch.cuda` or `torch.cpu`): `synchronize`, `device_count`, ..."""
    return getattr(torch, get_device_name())


def get_device_id() -> int:
    """The index of this process's current device (0 on the CPU)."""
    return torch.cuda.current_device() if is_cuda_available() else 0


def get_nccl_backend() -> str:
    """The torch.distributed backend for that device: "nccl" with CUDA, "gloo" on the CPU."""
    return "nccl" if is_cuda_available() else "gloo"
