"""Each trainer process's output, kept on the job's volume as well as in the pod's log.

A gang restart deletes every pod, and Kubernetes keeps a container's log only while its pod exists, so the
last words of a trainer that crashed (the traceback, NCCL's complaint, the one-line failure reason) were
gone by the time anyone looked. Here file descriptors 1 and 2 themselves are teed: everything written to
them (Python's logging and tracebacks, libraries' prints, C++ and NCCL warnings, child processes that inherit
them) goes where it went, unchanged, and to logs/attempt-<N>/rank-<R>.log under outputDir, which
`kubectl grpo logs <job> --attempt N` reads.

The file is bounded: past MAX_LOG_BYTES it is renamed to <name>.1 (replacing an older one) and a new one is
begun, so a process keeps at most twice that, its last words always in the newest file. A file that cannot
be written (a full volume) is given up, never the process: the copy to the original stderr goes on.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
from pathlib import Path
from typing import IO

log = logging.getLogger("grpo_trainer.log_capture")

MAX_LOG_BYTES = 16 << 20
_READ = 64 << 10


class OutputTee:
    """Tees file descriptors (stdout and stderr) into one bounded file; each keeps going where it went."""

    def __init__(self, path: Path, limit: int = MAX_LOG_BYTES, fds: tuple[int, ...] = (1, 2)) -> None:
        self.path = path
        self.limit = limit
        self.fds = fds
        self._file: IO[bytes] | None = None
        self._written = 0
        self._lock = threading.Lock()
        self._originals: dict[int, int] = {}
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("ab")
        self._written = self._file.tell()
        for fd in self.fds:
            original = os.dup(fd)
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            self._originals[fd] = original
            thread = threading.Thread(
                target=self._pump, args=(read_end, original), name=f"tee-{fd}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        atexit.register(self.stop)

    def _pump(self, read_end: int, original: int) -> None:
        while True:
            try:
                data = os.read(read_end, _READ)
            except OSError:
                break
            if not data:
                break
            with contextlib.suppress(OSError):
                os.write(original, data)
            with self._lock:
                self._keep(data)
        os.close(read_end)

    def _keep(self, data: bytes) -> None:
        while data and self._file is not None:
            try:
                if self._written >= self.limit:
                    self._file.close()
                    self.path.replace(self.path.with_name(self.path.name + ".1"))
                    self._file = self.path.open("ab")
                    self._written = 0
                piece, data = data[: self.limit - self._written], data[self.limit - self._written :]
                self._file.write(piece)
                self._file.flush()
                self._written += len(piece)
            except OSError:
                with contextlib.suppress(OSError):
                    self._file.close()
                self._file = None

    def stop(self) -> None:
        """Give the descriptors back and let the pumps drain what is in their pipes."""
        if not self._threads:
            return
        import sys

        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        for fd, original in self._originals.items():
            os.dup2(original, fd)  # closes the pipe's write end held at fd: its pump reads to EOF
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads = []
        with self._lock:
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
                self._file = None


def capture_output(path: Path) -> OutputTee | None:
    """Tee this process's stdout and stderr into ``path`` (None, with a warning, when it cannot be created)."""
    tee = OutputTee(path)
    try:
        tee.start()
    except OSError as exc:
        log.warning("not keeping this process's log on the volume (%s): %s", path, exc)
        return None
    return tee
