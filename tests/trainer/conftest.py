"""Fixtures the trainer tests share."""

import pytest


@pytest.fixture
def in_tmp_path(tmp_path, monkeypatch):
    """Run the test in its tmp_path: the trackers write under ./logs/<project>/<experiment>."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
