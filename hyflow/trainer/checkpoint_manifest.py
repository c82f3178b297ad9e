"""The checksum manifest of a checkpoint: the size and CRC-32 of every file, checked before anything is loaded.

    entries = manifest_entries(step_folder, extra={"trainer_state.pt": state_bytes})
    data = manifest_bytes(entries)                  # written as global_step_N/checksums.json, atomically
    problems = verify_manifest(step_folder)         # [] when every file is whole; None when there is no manifest

`remove_leftovers(folder)` deletes what interrupted writes leave (`*.tmp`, `*.old`); a completed save calls it.

The controller writes `checksums.json` when it completes a step (after the workers' shards, before
`trainer_state.pt`, whose bytes it hashes in memory), so a complete step always has one. Verifying reads every
file once and compares its size (a truncated file) and checksum (changed bytes); a missing file is a problem too.
CRC-32 (`zlib`, no extra dependency; it releases the GIL, so files hash in parallel threads) finds accidental
damage — truncation, bit rot, a partial copy — not deliberate tampering. Measured on two busy CPU cores with the
files in the page cache: 1.1–1.25 GB/s, about 5 s for a 0.5B model with its Adam state (≈ 5.9 GB).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

__all__ = [
    "MANIFEST_FILE",
    "file_checksum",
    "manifest_bytes",
    "manifest_entries",
    "remove_leftovers",
    "verify_manifest",
]

logger = logging.getLogger(__name__)

MANIFEST_FILE = "checksums.json"
MANIFEST_VERSION = 1
TMP_SUFFIXES = (".tmp", ".old")  # leftovers of an interrupted write: never part of a checkpoint
_CHUNK = 8 << 20
_THREADS = 8


def file_checksum(path: Path) -> tuple[int, str]:
    """(size in bytes, CRC-32 as 8 hex digits) of one file, read in 8 MiB chunks into one buffer."""
    crc, size = 0, 0
    buffer = memoryview(bytearray(_CHUNK))
    with path.open("rb", buffering=0) as file:
        while count := file.readinto(buffer):
            crc = zlib.crc32(buffer[:count], crc)  # releases the GIL: files hash in parallel threads
            size += count
    return size, f"{crc:08x}"


def _checksums(paths: list[Path]) -> list[tuple[int, str]]:
    """`file_checksum` of each path, several files at a time (one shard per rank: the work spreads over cores)."""
    with ThreadPoolExecutor(max_workers=min(_THREADS, max(1, len(paths)))) as pool:
        return list(pool.map(file_checksum, paths))


def bytes_checksum(data: bytes) -> tuple[int, str]:
    """`file_checksum` of bytes not yet written."""
    return len(data), f"{zlib.crc32(data):08x}"


def is_leftover(relative: str) -> bool:
    """Whether a path inside a checkpoint is the debris of an interrupted write (`*.tmp`, `*.old`, anywhere)."""
    return any(part.endswith(TMP_SUFFIXES) for part in Path(relative).parts)


def remove_leftovers(folder: Path, recursive: bool) -> None:
    """Delete the `*.tmp` / `*.old` files and folders that interrupted writes left in `folder`."""
    children = folder.rglob("*") if recursive else folder.iterdir()
    for path in sorted(children, key=lambda p: len(p.parts)):  # parents first: their children go with them
        if not path.name.endswith(TMP_SUFFIXES) or not os.path.lexists(path):
            continue
        logger.info("removing %s, left by an interrupted save", path)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _checkpoint_files(folder: Path) -> list[str]:
    """The relative paths of the files under `folder` that belong to the checkpoint, sorted."""
    found = []
    for root, _, names in os.walk(folder):
        for name in names:
            relative = os.path.relpath(os.path.join(root, name), folder)
            if relative != MANIFEST_FILE and not is_leftover(relative):
                found.append(relative)
    return sorted(found)


def manifest_entries(folder: Path, extra: dict[str, bytes] | None = None) -> dict[str, dict[str, Any]]:
    """Relative path → {"size", "crc32"} of every file under `folder`, plus `extra` files given as bytes (written
    after the manifest; their name wins over a file of the same name already there)."""
    files = _checkpoint_files(folder)
    entries = {}
    for relative, (size, crc) in zip(files, _checksums([folder / f for f in files]), strict=True):
        entries[relative] = {"size": size, "crc32": crc}
    for relative, data in (extra or {}).items():
        size, crc = bytes_checksum(data)
        entries[relative] = {"size": size, "crc32": crc}
    return dict(sorted(entries.items()))


def manifest_bytes(entries: dict[str, dict[str, Any]]) -> bytes:
    """The content of `checksums.json` for `entries` (the checkpoint manager writes it atomically)."""
    return json.dumps({"version": MANIFEST_VERSION, "algorithm": "crc32", "files": entries}, indent=1).encode()


def verify_manifest(folder: Path) -> list[str] | None:
    """What is wrong with the files of `folder` against its manifest: one line per damaged file, naming the file
    and the fault ([] when all are whole); None when the folder has no manifest (written by an older hyflow)."""
    manifest_path = folder / MANIFEST_FILE
    if not manifest_path.is_file():
        return None
    try:
        entries = json.loads(manifest_path.read_text())["files"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
        return [f"{manifest_path}: the checksum manifest itself is unreadable ({type(error).__name__}: {error})"]
    problems = []
    present = [relative for relative in entries if (folder / relative).is_file()]
    found = dict(zip(present, _checksums([folder / relative for relative in present]), strict=True))
    for relative, expected in entries.items():
        path = folder / relative
        if relative not in found:
            problems.append(f"{path}: missing (the manifest lists it with {expected['size']} bytes)")
            continue
        size, crc = found[relative]
        if size != expected["size"]:
            kind = "truncated" if size < expected["size"] else "longer than written"
            problems.append(f"{path}: {kind}: {size} bytes, {expected['size']} were written")
        elif crc != expected["crc32"]:
            problems.append(f"{path}: corrupt: CRC-32 {crc}, {expected['crc32']} was written (same size)")
    return problems
