"""Fixtures for the data tests: the shared tiny tokenizer and a helper that writes rows to parquet."""

import pytest

from hyflow.data.prepare import write_parquet
from hyflow.models.tiny import build_tiny_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture
def write_rows(tmp_path):
    """write_rows(rows, name="data.parquet") -> path of a parquet file holding `rows`."""

    def write(rows, name="data.parquet"):
        path = str(tmp_path / name)
        write_parquet(rows, path)
        return path

    return write
