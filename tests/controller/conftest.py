"""One Ray session shared by the controller tests (Ray start-up is the slow part), on CPU only."""

from __future__ import annotations

import sys

import pytest

from . import sample_workers


@pytest.fixture(scope="module")
def ray_session():
    """Ray with 4 logical CPUs, started once (or the session another test started) and shut down at the end.

    The test worker classes travel to Ray's processes by value, so they work whoever started Ray.
    """
    ray = pytest.importorskip("ray")
    from hyflow.config.trainer import RayInitConfig
    from hyflow.controller import init_ray

    ray.cloudpickle.register_pickle_by_value(sample_workers)
    if not ray.is_initialized():
        init_ray(RayInitConfig(num_cpus=4))
    return ray


@pytest.fixture(scope="session", autouse=True)
def _shutdown_ray_at_the_end():
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
