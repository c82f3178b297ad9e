"""Where an image or video part's bytes come from: inline data URLs, and file:// URLs only inside the server's
--allowed-local-media-path (symlinks resolved); web addresses never."""

from __future__ import annotations

import base64
import errno

import pytest

import hyflow.serving.media_urls as media_urls
from hyflow.serving.errors import BadRequest
from hyflow.serving.media_urls import locate

WHERE = "messages[0].content[0]"


def test_a_data_url_gives_its_bytes():
    url = "data:video/gif;base64," + base64.b64encode(b"GIF89a...").decode()
    assert locate(url, WHERE, "video", None).read() == b"GIF89a..."


def test_a_file_inside_the_allowed_directory_is_read(tmp_path):
    (tmp_path / "clip one.gif").write_bytes(b"GIF89a...")
    source = locate(f"file://{tmp_path}/clip%20one.gif", WHERE, "video", str(tmp_path))
    assert (source.num_bytes, source.head(3), source.read()) == (9, b"GIF", b"GIF89a...")


def test_a_file_is_read_no_further_than_the_size_it_was_located_at(tmp_path):
    path = tmp_path / "clip.gif"
    path.write_bytes(b"GIF89a...")
    source = locate(f"file://{path}", WHERE, "video", str(tmp_path))
    path.write_bytes(b"GIF89a..." + b"x" * 1000)  # grown after its size was checked
    assert source.read() == b"GIF89a..."


def test_a_file_url_without_an_allowed_directory_is_refused_naming_the_flag(tmp_path):
    (tmp_path / "clip.gif").write_bytes(b"GIF89a...")
    with pytest.raises(BadRequest, match=r"content\[0\].*--allowed-local-media-path \(not set\)"):
        locate(f"file://{tmp_path}/clip.gif", WHERE, "video", None).read()


def test_a_file_outside_the_allowed_directory_or_reached_through_a_symlink_is_refused(tmp_path):
    allowed, secret = tmp_path / "media", tmp_path / "secret.png"
    allowed.mkdir()
    secret.write_bytes(b"private")
    (allowed / "link.png").symlink_to(secret)
    for url in (f"file://{secret}", f"file://{allowed}/../secret.png", f"file://{allowed}/link.png"):
        with pytest.raises(BadRequest, match="outside the server's --allowed-local-media-path"):
            locate(url, WHERE, "image", str(allowed)).read()


def test_a_missing_file_and_a_file_on_another_host_are_refused(tmp_path):
    with pytest.raises(BadRequest, match="no such file"):
        locate(f"file://{tmp_path}/gone.gif", WHERE, "video", str(tmp_path)).read()
    with pytest.raises(BadRequest, match="outside"):
        locate(f"file://fileserver{tmp_path}/clip.gif", WHERE, "video", str(tmp_path)).read()


def test_a_web_address_is_refused_and_nothing_is_downloaded():
    with pytest.raises(BadRequest, match=r"downloads nothing.*data:image/png;base64"):
        locate("https://example.com/cat.png", WHERE, "image", "/").read()


def test_a_file_the_server_may_not_read_is_a_400_naming_the_part(tmp_path, monkeypatch):
    (tmp_path / "clip.gif").write_bytes(b"GIF89a...")
    source = locate(f"file://{tmp_path}/clip.gif", WHERE, "video", str(tmp_path))

    def refused(path, mode="r"):
        raise PermissionError(errno.EACCES, "Permission denied", path)

    monkeypatch.setattr(media_urls, "open", refused, raising=False)
    with pytest.raises(BadRequest, match=r"content\[0\]: the video_url file .*cannot be read \(Permission denied\)"):
        source.head(3)
