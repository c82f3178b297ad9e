"""Fixtures of the engine tests."""

import pytest

from .engine_testkit import FAMILIES


@pytest.fixture(params=sorted(FAMILIES))
def family(request) -> str:
    return request.param
