"""Completion requests, forwarded to trainer rank 0's policy server, held while the trainer is down.

The client (DSPy through litellm) samples with no retry of its own: a refused connection during a gang
restart would end its run. So a request the trainer cannot take (connection refused or reset, a 502/503/504
while it starts) is retried until ``wait_seconds`` have passed since it arrived, and only then answered
503 with Arbor's error body. Anything else the trainer answers is copied back as it is.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

import aiohttp

from grpo_gateway.state import iso_now

log = logging.getLogger("grpo_gateway")

# Answers that mean "the policy server is not (yet) there": retried like a refused connection.
_RETRY_STATUSES = frozenset({502, 503, 504})
_RETRY_PAUSE_SECONDS = 1.0


class Forwarder:
    def __init__(self, session: aiohttp.ClientSession, trainer_url: str, wait_seconds: float) -> None:
        self.session = session
        self.trainer_url = trainer_url.rstrip("/")
        self.wait_seconds = wait_seconds
        self.held = 0  # requests waiting for the trainer right now

    async def forward(
        self, path: str, body: bytes, client_waiting: Callable[[], bool] = lambda: True
    ) -> tuple[int, str, bytes]:
        """(status, content type, body) of the trainer's answer, or the gateway's 503 after the wait. A held
        request whose client has gone (it timed out and will retry) is dropped rather than sampled."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_seconds
        url = self.trainer_url + path
        why = ""
        attempts = 0
        while True:
            attempts += 1
            try:
                async with self.session.post(
                    url, data=body, headers={"Content-Type": "application/json"}
                ) as response:
                    payload = await response.read()
                    if response.status not in _RETRY_STATUSES:
                        if attempts > 1:
                            log.info("%s answered after %s attempts", path, attempts)
                        return response.status, response.content_type or "application/json", payload
                    why = f"the policy server answered HTTP {response.status}"
            except (aiohttp.ClientConnectionError, TimeoutError) as exc:
                why = f"{type(exc).__name__}: {exc}"
            if attempts == 1:
                log.info("holding %s: trainer rank 0 is not answering (%s)", path, why)
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            if not client_waiting():
                log.info("dropping held %s: its client disconnected", path)
                why = "the client disconnected"
                break
            self.held += 1
            try:
                await asyncio.sleep(min(_RETRY_PAUSE_SECONDS, remaining))
            finally:
                self.held -= 1
        message = (
            f"trainer rank 0 did not answer within {self.wait_seconds:g}s ({why}); the job may be restarting, "
            "suspended or finished: see kubectl get grpojob"
        )
        log.warning("%s: %s", path, message)
        error = {"type": "ServiceUnavailable", "message": message, "timestamp": iso_now()}
        return 503, "application/json", json.dumps(error).encode()
