"""Shared test setup: quiet, small-machine Ray settings and the GPU skip rule."""

import os

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def one_torch_thread():
    """Tiny models train fastest on one thread; more only contend for a two-core box (opt in per module with
    `pytestmark = pytest.mark.usefixtures("one_torch_thread")`)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def no_distributed_env_leaks_into_later_tests():
    """A local worker group writes RANK, MASTER_PORT, ... into os.environ and its process group keeps the port bound
    for the rest of the session; a later test's subprocess (a README command run as written) would inherit
    MASTER_PORT and fail to bind it. Each test gets the environment it started with back."""
    from hyflow.controller.worker import DIST_ENV_KEYS

    saved = {key: os.environ.get(key) for key in DIST_ENV_KEYS}
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
