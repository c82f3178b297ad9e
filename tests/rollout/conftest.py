"""Fixtures of the rollout tests."""

import pytest

from .rollout_testkit import FAMILIES


@pytest.fixture(params=sorted(FAMILIES))
def family(request) -> str:
    return request.param
