"""Invalid UTF-8 in a data file, located: the file, the row, the column and the byte.

    rows = read_jsonl_rows(path)                 # JSON lines, each decoded on its own
    raise invalid_utf8_in_table(table, path)     # after pyarrow's `to_pylist` failed on a string column

pyarrow reads a parquet string column without checking its bytes and fails only when it turns them into Python
strings, with no row or column in the message; these helpers find them.
"""

from __future__ import annotations

import json
from typing import Any


def read_jsonl_rows(path: str) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file; a line that is not valid UTF-8 is a ValueError naming the line and column."""
    rows = []
    with open(path, "rb") as f:
        for line_number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                column = len(raw[: err.start].decode("utf-8", errors="replace")) + 1
                raise ValueError(
                    f"data file {path!r}, row {len(rows)} (line {line_number}), column {column}: byte "
                    f"{raw[err.start : err.start + 1]!r} is not valid UTF-8 ({err.reason}). Fix: re-encode the file "
                    "as UTF-8 (e.g. `iconv -f latin1 -t utf-8`), or drop that row."
                ) from err
            if line.strip():
                rows.append(json.loads(line))
    return rows


def invalid_utf8_in_table(table: Any, path: str) -> ValueError:
    """The error for a parquet table whose `to_pylist` raised UnicodeDecodeError: the first bad row of the first
    bad column (a binary search over row slices, so only the failing path pays for it)."""
    for name in table.column_names:
        column = table.column(name)
        if _decodes(column):
            continue
        low, high = 0, len(column)  # the first bad row is in [low, high)
        while high - low > 1:
            middle = (low + high) // 2
            if _decodes(column.slice(low, middle - low)):
                low = middle
            else:
                high = middle
        detail = _decode_error(column.slice(low, 1))
        return ValueError(
            f"data file {path!r}, row {low}, column {name!r}: the text is not valid UTF-8 ({detail}). Fix: write "
            "that column as UTF-8 text (decode the source with its real encoding first), or drop that row."
        )
    return ValueError(f"data file {path!r} holds text that is not valid UTF-8. Fix: re-encode it as UTF-8.")


def _decodes(column: Any) -> bool:
    return _decode_error(column) is None


def _decode_error(column: Any) -> str | None:
    try:
        column.to_pylist()
    except UnicodeDecodeError as err:
        return f"byte {err.object[err.start : err.start + 1]!r} at position {err.start}: {err.reason}"
    return None
