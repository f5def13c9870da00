"""TEST HARNESS — the local stand-ins for a job's vLLM Services (tests/harness/local_runner.py).

A job runs one vLLM server per ``spec.generation.replicas``, each behind a Service of its own (``<job>-gen``
for replica 0, ``<job>-gen-r<r>`` for replica r). Without cluster DNS, the runner gives each replica one
local port instead: the replica's vLLM process (whichever pod of the replica runs now) listens on it, and
trainer.json's addresses of the servers (``generation.serverHost``/``serverPort``, replica 0's, and with
several replicas ``generation.serverUrls``) are rewritten to 127.0.0.1 and those ports.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from grpo_operator.builders.common import LABEL_GENERATION_REPLICA


def replica_of(pod: dict[str, Any]) -> str:
    """The replica a generation pod serves, by its label; "0" for a pod without one (one server)."""
    return str((pod["metadata"].get("labels") or {}).get(LABEL_GENERATION_REPLICA, "0"))


def rewrite_generation(generation: dict[str, Any], port_of: Callable[[str], int]) -> None:
    """Points trainer.json's ``generation`` at the local ports, ``port_of(replica)`` for each replica, in
    place: serverHost/serverPort at replica 0's, and each of serverUrls (when present, in replica order)
    at its replica's."""
    generation["serverHost"] = "127.0.0.1"
    generation["serverPort"] = port_of("0")
    if generation.get("serverUrls"):
        generation["serverUrls"] = [
            f"http://127.0.0.1:{port_of(str(replica))}" for replica in range(len(generation["serverUrls"]))
        ]
