"""The process group of a benchmark run under torchrun (one owner for the scripts that need it).

from torchrun_group import init_process_group   # this folder's scripts
device = init_process_group()                   # NCCL on the rank's GPU, else gloo on the CPU
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def init_process_group() -> torch.device:
    """The torchrun rank's process group (NCCL on CUDA, else gloo) and its device."""
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        return device
    dist.init_process_group("gloo")
    return torch.device("cpu")
