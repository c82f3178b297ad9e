"""One image of prompt data, decoded: an entry of a row's image list (parquet's `{"bytes", "path"}` struct, a file
path, or a PIL image) as an RGB PIL image, with a row error that names the column and the entry when it cannot be.

Shared by `hyflow.data.multimodal` (a row's images) and `hyflow.data.video` (a video given as a list of frames).
"""

from __future__ import annotations

import io
import os
from typing import Any

from PIL import Image

from hyflow.data.schema import RowError

__all__ = ["decode_image"]


def decode_image(item: Any, error: RowError, column: str, position: int) -> Image.Image:
    """One entry of a row's image list as an RGB PIL image: `{"bytes", "path"}`, a file path, or a PIL image."""
    if isinstance(item, Image.Image):
        return item.convert("RGB")
    where = f"image {position}"
    data, path = (item.get("bytes"), item.get("path")) if isinstance(item, dict) else (None, item)
    if data is None:
        if not isinstance(path, (str, os.PathLike)) or not path:
            raise error(column, f"{where} is {item!r}", 'Store {"bytes": <encoded image>, "path": ...} or a file path.')
        if not os.path.isfile(path):
            raise error(column, f"{where}: the file {os.fspath(path)!r} does not exist", "Fix the path or embed bytes.")
        with open(path, "rb") as f:
            data = f.read()
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except Exception as exc:  # Pillow raises several types for broken data
        raise error(
            column, f"{where} cannot be decoded ({exc})", "Store PNG/JPEG bytes (e.g. PIL's Image.save)."
        ) from exc
    return image.convert("RGB")
