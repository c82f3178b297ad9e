"""Fixtures the trainer tests share."""

import pytest


@pytest.fixture
def in_tmp_path(tmp_path, monkeypatch):
    """Run the test in its tmp_path: the trackers write under ./logs/<project>/<experiment>."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def ray_started_here():
    """Ray is started by the trainer (trainer.ray_init); shut it down after the module if it was not running, so
    the next module (or another test directory) starts from a clean Ray."""
    ray = pytest.importorskip("ray")
    was_running = ray.is_initialized()
    yield
    if not was_running and ray.is_initialized():
        ray.shutdown()
