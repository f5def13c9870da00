"""Reading a W&B run file (run-<id>.wandb) back, for the offline-mode tests.

wandb 0.31 ships no Python reader of its run files (its Go core writes them and `wandb sync` uploads them).
The file is W&B's protobuf ``Record`` messages in LevelDB's log framing: a 7-byte header (":W&B", magic
0xBEE1, version 0), then 32 KiB blocks of chunks, each chunk a 4-byte checksum, a 2-byte little-endian
length, a 1-byte type (1 full, 2 first, 3 middle, 4 last) and its bytes; a block's tail too short for a
chunk header is zero padding. The records are decoded with W&B's own protobuf classes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_HEADER = 7
_BLOCK = 32 * 1024
_CHUNK_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    payloads: list[bytes] = []
    pending: list[bytes] = []
    pos = _HEADER
    while pos + _CHUNK_HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _CHUNK_HEADER:
            pos += left
            continue
        length = int.from_bytes(data[pos + 4 : pos + 6], "little")
        kind = data[pos + 6]
        if kind == 0:
            pos += left
            continue
        chunk = data[pos + _CHUNK_HEADER : pos + _CHUNK_HEADER + length]
        pos += _CHUNK_HEADER + length
        if kind == _FULL:
            payloads.append(chunk)
        elif kind == _FIRST:
            pending = [chunk]
        elif kind == _MIDDLE:
            pending.append(chunk)
        elif kind == _LAST:
            payloads.append(b"".join([*pending, chunk]))
    record: Any = getattr(wandb_internal_pb2, "Record")  # noqa: B009 (generated protobuf code: no stubs)
    return [record.FromString(p) for p in payloads]


def history(path: Path) -> dict[int, dict[str, Any]]:
    """Each logged step's values by key (nested keys joined with '/')."""
    rows: dict[int, dict[str, Any]] = {}
    for record in records(path):
        if record.WhichOneof("record_type") != "history":
            continue
        row = rows.setdefault(record.history.step.num, {})
        for item in record.history.item:
            row[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return rows


def config(path: Path) -> dict[str, Any]:
    """The run's config as its updates left it (the run record's, then each config record's)."""
    found: dict[str, Any] = {}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        updates = (
            record.run.config.update if kind == "run" else record.config.update if kind == "config" else []
        )
        for item in updates:
            found[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return found


def summary(path: Path) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for record in records(path):
        if record.WhichOneof("record_type") == "summary":
            for item in record.summary.update:
                found[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return found
