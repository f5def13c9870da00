"""SIGTERM handling: the handler only sets a flag; the trainer acts on it at the next step boundary
(a signal handler must not do I/O, and every rank has to agree before saving)."""

from __future__ import annotations

import threading
from typing import Any


class StopFlag:
    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self, *_: Any) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()
