"""The device helpers (hyflow.utils.device) answer for CUDA when present and for the CPU otherwise."""

import torch

from hyflow.utils import device


def test_without_cuda_the_helpers_name_the_cpu_and_gloo(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device.get_device_name() == "cpu" and device.get_nccl_backend() == "gloo"
    assert device.get_torch_device() is torch.cpu and device.get_device_id() == 0


def test_with_cuda_the_helpers_name_cuda_and_nccl(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert device.get_device_name() == "cuda" and device.get_nccl_backend() == "nccl"
    assert device.get_torch_device() is torch.cuda and device.get_device_id() == 3


def test_a_device_built_from_the_helpers_is_a_valid_torch_device():
    assert torch.zeros(1, device=torch.device(device.get_device_name(), device.get_device_id())).numel() == 1
