"""Invalid UTF-8 in a data file is located: file, row, column (parquet string columns and JSON lines)."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hyflow.data.dataset import read_rows


def _string_column(values: list[bytes]) -> pa.Array:
    """A string column whose bytes pyarrow does not check (as a writer that skips validation leaves it)."""
    offsets = np.cumsum([0, *(len(v) for v in values)]).astype(np.int32)
    buffers = [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(values))]
    return pa.Array.from_buffers(pa.string(), len(values), buffers)


def test_invalid_utf8_in_a_parquet_string_column_names_the_file_row_and_column(tmp_path):
    path = tmp_path / "train.parquet"
    answers = [f"{i}".encode() for i in range(40)]
    answers[27] = b"caf\xe9"  # latin-1, not UTF-8
    table = pa.table({"data_source": pa.array(["arith"] * 40), "answer": _string_column(answers)})
    pq.write_table(table, path)

    with pytest.raises(ValueError) as caught:
        read_rows(path)

    message = str(caught.value)
    assert message.startswith(f"data file {str(path)!r}, row 27, column 'answer': the text is not valid UTF-8")
    assert "b'\\xe9'" in message and "Fix:" in message


def test_invalid_utf8_in_a_json_lines_file_names_the_row_line_and_column(tmp_path):
    path = tmp_path / "train.jsonl"
    good = json.dumps({"data_source": "arith", "answer": "4"}).encode()
    path.write_bytes(good + b"\n\n" + b'{"data_source": "arith", "answer": "caf\xe9"}\n')

    with pytest.raises(ValueError) as caught:
        read_rows(path)

    assert str(caught.value).startswith(f"data file {str(path)!r}, row 1 (line 3), column 40: byte b'\\xe9'")


def test_valid_files_read_as_before(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"answer": "café"}\n')

    assert read_rows(path) == [{"answer": "café"}]
