"""Reading the JSON-lines files the trainer writes on the job's volume, in bounded chunks."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from grpo_operator.kubectl_plugin import data
from grpo_operator.kubectl_plugin.errors import NotFound
from grpo_operator.kubectl_plugin.output import warn, where
from grpo_operator.kubectl_plugin.volume import VolumeTransport


class Tail:
    """The records of a JSON-lines file on the volume, read in bounded chunks: first its newest
    ``data.FILE_LIMIT`` bytes, then (``follow``) what is appended."""

    def __init__(
        self,
        volume: VolumeTransport,
        path: str,
        keep: Callable[[dict[str, Any]], bool] | None = None,
        line_limit: int = data.LINE_LIMIT,
    ) -> None:
        self.volume = volume
        self.path = path
        self.keep = keep
        self.line_limit = line_limit
        self.offset = 0
        self.scanner = data.JsonlScanner(path, line_limit=line_limit)

    def first(self, *, complete: bool) -> list[dict[str, Any]] | None:
        """The records of the newest part of the file (None when it does not exist); ``complete``
        also takes an unterminated last line, which a file still being written may have."""
        size = self.volume.size(self.path)
        if size is None:
            return None
        start = max(0, size - data.FILE_LIMIT)
        if start:
            # From the byte before: the line it ends (or the newline itself) is dropped as partial.
            self.scanner = data.JsonlScanner(self.path, line_limit=self.line_limit, skip_first=True)
            warn(
                f"{self.path} is {data.size_text(size)}: only its newest {data.size_text(data.FILE_LIMIT)} "
                "are read"
            )
        self.offset = max(0, start - 1)
        return self._read(size, complete)

    def more(self) -> list[dict[str, Any]]:
        size = self.volume.size(self.path)
        if size is None:
            return []
        if size < self.offset:  # the file was replaced: read the new one from its start
            self.offset, self.scanner = 0, data.JsonlScanner(self.path, line_limit=self.line_limit)
        return self._read(min(size, self.offset + data.FILE_LIMIT), complete=False)

    def _read(self, end: int, complete: bool) -> list[dict[str, Any]]:
        records: deque[dict[str, Any]] = deque(maxlen=data.RECORD_LIMIT)
        seen = 0

        def take(batch: list[dict[str, Any]]) -> None:
            nonlocal seen
            for record in batch:
                if self.keep is None or self.keep(record):
                    seen += 1
                    records.append(record)

        for chunk in self.volume.chunks(self.path, self.offset, end - self.offset):
            self.offset += len(chunk)
            take(self.scanner.feed(chunk))
        if complete:
            take(self.scanner.finish())
        for note in self.scanner.summary():
            warn(note)
        self.scanner.notices.clear()
        self.scanner.malformed = self.scanner.long_lines = 0
        if seen > len(records):
            warn(f"kept the newest {len(records)} of {seen} records of {self.path}")
        return list(records)


def read_jsonl(volume: VolumeTransport, path: str, job: dict[str, Any], what: str) -> list[dict[str, Any]]:
    records = Tail(volume, path).first(complete=True)
    if records is None:
        raise NotFound(
            f"no {what} yet: {path} does not exist on the job's volume ({where(job)}; the trainer writes it after each step)"
        )
    return records
