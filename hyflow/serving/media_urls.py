"""Where the bytes of an image or video part come from: an inline `data:` URL, or a `file://` URL under the
directory the server was started with (`--allowed-local-media-path`, vLLM's flag); never the network.

    source = locate(url, "messages[0].content[1]", "video", allowed_root=None)   # a file is found, not read
    head, data = source.head(65536), source.read()

A data URL is `data:image/<format>;base64,<data>` (a video's also `data:video/<format>;base64,<data>`). A file URL
(`file:///abs/path/clip.gif`) is read only when the server has an allowed directory and the file, its symlinks
resolved, lies inside it; without one, or outside it, it is a 400 that names the flag. An `http(s)://` URL is a 400
that says how to send the bytes instead: the server downloads nothing. A file's size comes from `stat` when it is
located, so the media budget bounds it before a byte of it is read (media_budget.py: `--max-request-bytes`), and
`read` reads no more than that size, however the file grows meanwhile.
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote, urlparse

from hyflow.serving.errors import BadRequest

Kind = Literal["image", "video"]
_EXAMPLE = {"image": "data:image/png;base64,<the file's bytes in base64>", "video": "data:image/gif;base64,<...>"}


def _data_bytes(url: str, where: str, kind: Kind) -> bytes:
    header, _, data = url.partition(",")
    media_types = ("data:video/", "data:image/") if kind == "video" else ("data:image/",)
    if not header.startswith(media_types) or not header.endswith(";base64") or not data:
        shapes = " or ".join(f"{prefix}<format>;base64,<data>" for prefix in media_types)
        raise BadRequest(f"{where}: {kind}_url must be {shapes} (got {url[:40]!r}...)", "messages")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as error:
        raise BadRequest(f"{where}: the {kind}_url data is not base64 ({error})", "messages") from error


def _file_path(url: str, where: str, kind: Kind, allowed_root: str | None) -> str:
    if allowed_root is None:
        raise BadRequest(
            f"{where}: {kind}_url {url[:80]!r} is a local file, which this server reads only under its "
            f"--allowed-local-media-path (not set); send the {kind} inline as {_EXAMPLE[kind]}, or restart the "
            "server with --allowed-local-media-path DIR",
            "messages",
        )
    parsed = urlparse(url)
    root = os.path.realpath(allowed_root)
    path = os.path.realpath(unquote(parsed.path))
    if parsed.netloc not in ("", "localhost") or os.path.commonpath([root, path]) != root:
        raise BadRequest(
            f"{where}: {kind}_url {url[:80]!r} is outside the server's --allowed-local-media-path {root!r}; move "
            f"the file there or send the {kind} inline",
            "messages",
        )
    if not os.path.isfile(path):
        raise BadRequest(f"{where}: {kind}_url {url[:80]!r}: there is no such file", "messages")
    return path


@dataclass
class MediaSource:
    """Where one part's bytes are: in memory (a data URL's, decoded) or in a file under the allowed directory, not
    read yet (`path`; `num_bytes` is its size from stat)."""

    where: str  # "messages[i].content[k]"
    kind: Kind
    num_bytes: int
    data: bytes | None = None
    path: str | None = None

    def head(self, limit: int) -> bytes:
        """The first `limit` bytes (of a file: only those are read)."""
        return self.data[:limit] if self.data is not None else self._read_file(min(limit, self.num_bytes))

    def read(self) -> bytes:
        """All the bytes; of a file, at most the `num_bytes` its size was checked at."""
        return self.data if self.data is not None else self._read_file(self.num_bytes)

    def _read_file(self, size: int) -> bytes:
        try:
            with open(self.path, "rb") as f:
                return f.read(size)
        except OSError as error:
            raise BadRequest(
                f"{self.where}: the {self.kind}_url file {self.path!r} cannot be read ({error.strerror}); make it "
                f"readable by the server, or send the {self.kind} inline",
                "messages",
            ) from error


def locate(url: str, where: str, kind: Kind, allowed_root: str | None) -> MediaSource:
    """Where an image or video part's bytes are (see the module docstring); BadRequest naming `where`."""
    if url.startswith(("http://", "https://")):
        raise BadRequest(
            f"{where}: {kind}_url {url[:80]!r} is a web address, and hyflow serve downloads nothing; send the {kind} "
            f"inline as a data URL: {_EXAMPLE[kind]}",
            "messages",
        )
    if url.startswith("file://"):
        path = _file_path(url, where, kind, allowed_root)
        return MediaSource(where, kind, os.stat(path).st_size, path=path)
    data = _data_bytes(url, where, kind)
    return MediaSource(where, kind, len(data), data=data)
