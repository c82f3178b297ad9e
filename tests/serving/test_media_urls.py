"""Where an image or video part's bytes come from: inline data URLs, and file:// URLs only inside the server's
--allowed-local-media-path (symlinks resolved); web addresses never."""

from __future__ import annotations

import base64

import pytest

from hyflow.serving.media_urls import part_bytes
from hyflow.serving.requests import BadRequest

WHERE = "messages[0].content[0]"


def test_a_data_url_gives_its_bytes():
    url = "data:video/gif;base64," + base64.b64encode(b"GIF89a...").decode()
    assert part_bytes(url, WHERE, "video", None) == b"GIF89a..."


def test_a_file_inside_the_allowed_directory_is_read(tmp_path):
    (tmp_path / "clip one.gif").write_bytes(b"GIF89a...")
    assert part_bytes(f"file://{tmp_path}/clip%20one.gif", WHERE, "video", str(tmp_path)) == b"GIF89a..."


def test_a_file_url_without_an_allowed_directory_is_refused_naming_the_flag(tmp_path):
    (tmp_path / "clip.gif").write_bytes(b"GIF89a...")
    with pytest.raises(BadRequest, match=r"content\[0\].*--allowed-local-media-path \(not set\)"):
        part_bytes(f"file://{tmp_path}/clip.gif", WHERE, "video", None)


def test_a_file_outside_the_allowed_directory_or_reached_through_a_symlink_is_refused(tmp_path):
    allowed, secret = tmp_path / "media", tmp_path / "secret.png"
    allowed.mkdir()
    secret.write_bytes(b"private")
    (allowed / "link.png").symlink_to(secret)
    for url in (f"file://{secret}", f"file://{allowed}/../secret.png", f"file://{allowed}/link.png"):
        with pytest.raises(BadRequest, match="outside the server's --allowed-local-media-path"):
            part_bytes(url, WHERE, "image", str(allowed))


def test_a_missing_file_and_a_file_on_another_host_are_refused(tmp_path):
    with pytest.raises(BadRequest, match="no such file"):
        part_bytes(f"file://{tmp_path}/gone.gif", WHERE, "video", str(tmp_path))
    with pytest.raises(BadRequest, match="outside"):
        part_bytes(f"file://fileserver{tmp_path}/clip.gif", WHERE, "video", str(tmp_path))


def test_a_web_address_is_refused_and_nothing_is_downloaded():
    with pytest.raises(BadRequest, match=r"downloads nothing.*data:image/png;base64"):
        part_bytes("https://example.com/cat.png", WHERE, "image", "/")
