"""Completion requests, forwarded to trainer rank 0's policy server, held while the trainer is down.

The client (DSPy through litellm) samples with no retry of its own: a refused connection during a gang
restart would end its run. So a request the trainer cannot take (connection refused or reset, a 502/503/504
while it starts) is retried until ``wait_seconds`` have passed since it arrived, and only then answered
503 with Arbor's error body. Anything else the trainer answers is copied back as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Iterator

import aiohttp

from grpo_gateway.state import ProtocolError, iso_now

log = logging.getLogger("grpo_gateway")

# Answers that mean "the policy server is not (yet) there": retried like a refused connection.
_RETRY_STATUSES = frozenset({502, 503, 504})
_RETRY_PAUSE_SECONDS = 1.0


class Forwarder:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        trainer_url: str,
        wait_seconds: float,
        *,
        max_held: int = 256,
        max_held_bytes: int = 64 * 1024 * 1024,
        max_answer_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.session = session
        self.trainer_url = trainer_url.rstrip("/")
        self.wait_seconds = wait_seconds
        self.max_held = max_held
        self.max_held_bytes = max_held_bytes
        self.max_answer_bytes = max_answer_bytes
        self.held = 0  # requests waiting for the trainer right now
        # Completion requests in the gateway (forwarded or held) and their bodies' bytes: each holds its body
        # until answered, and a trainer away for startupTimeoutSeconds would otherwise let them pile up.
        self.in_flight = 0
        self.in_flight_bytes = 0

    @contextlib.contextmanager
    def holding(self, size: int) -> Iterator[None]:
        """Count one completion request of ``size`` bytes while it is in the gateway; ProtocolError (429)
        naming the cap when the gateway holds as many as it may."""
        if self.in_flight >= self.max_held:
            raise ProtocolError(
                f"the gateway holds {self.in_flight} completion requests already, its cap "
                f"(maxHeldCompletions = {self.max_held}): retry later, or send fewer requests at once "
                "(DSPy: a smaller num_threads)",
                status=429,
            )
        if self.in_flight_bytes + size > self.max_held_bytes:
            raise ProtocolError(
                f"the gateway holds {self.in_flight_bytes} bytes of completion requests, and this one's "
                f"{size} would pass its cap (maxHeldCompletionBytes = {self.max_held_bytes}): retry later",
                status=429,
            )
        self.in_flight += 1
        self.in_flight_bytes += size
        try:
            yield
        finally:
            self.in_flight -= 1
            self.in_flight_bytes -= size

    async def _read_answer(self, response: aiohttp.ClientResponse) -> bytes | None:
        """The policy server's answer, or None when it is longer than ``max_answer_bytes``."""
        if response.content_length is not None and response.content_length > self.max_answer_bytes:
            return None
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_any():
            size += len(chunk)
            if size > self.max_answer_bytes:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

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
                    payload = await self._read_answer(response)
                    if payload is None:
                        message = (
                            f"trainer rank 0's answer to {path} is longer than {self.max_answer_bytes} bytes "
                            "(G transcripts): ask for fewer or shorter completions"
                        )
                        log.warning("%s", message)
                        error = {"type": "BadGateway", "message": message, "timestamp": iso_now()}
                        return 502, "application/json", json.dumps(error).encode()
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
