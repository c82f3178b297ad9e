"""Reading tracker output back the way each tool stores it, so that tests check what a user would see.

`wandb_history` reads an offline run's transaction log (`run-<id>.wandb`): records in LevelDB's log framing
(32 KiB blocks, each record a 7-byte header — CRC32, length, type — then a chunk; FULL or FIRST…LAST chunks make
one record), each record one of wandb's own `wandb_internal_pb2.Record` protobufs. wandb has no local reader for
offline runs (its public API reads from the server), hence this one.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK_SIZE = 32 * 1024
HEADER_SIZE = 7  # CRC32 (4 bytes), length (2), chunk type (1); also the size of the file's own header
FULL, LAST = 1, 4


def _records(data: bytes) -> list[bytes]:
    records, pending, pos = [], b"", HEADER_SIZE
    while pos + HEADER_SIZE <= len(data):
        room = BLOCK_SIZE - pos % BLOCK_SIZE
        _, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER_SIZE])
        if room < HEADER_SIZE or (length == 0 and kind == 0):  # the block's zero-padded tail
            pos += room
            continue
        pending += data[pos + HEADER_SIZE : pos + HEADER_SIZE + length]
        pos += HEADER_SIZE + length
        if kind in (FULL, LAST):
            records.append(pending)
            pending = b""
    return records


def wandb_history(run_folder: Path) -> list[dict]:
    """The `run.log` rows of one offline run folder (`…/wandb/offline-run-*`), in order."""
    from wandb.proto import wandb_internal_pb2

    (log,) = run_folder.glob("run-*.wandb")
    rows = []
    for data in _records(log.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            items = record.history.item
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items})
    return rows
