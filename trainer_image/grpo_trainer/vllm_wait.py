"""Wait for the job's vLLM server before TRL's client is built.

The vLLM pod starts together with the trainers but needs far longer to become ready (image pull, model
download, CUDA graph capture). TRL's client gives up after ``vllm_server_timeout``; waiting here first,
within ``generation.startupTimeoutSeconds`` from trainer.json, means TRL's clock starts only once vLLM
answers. Every rank waits on its own (no collective), so no rank sits in a barrier meanwhile.
"""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable

log = logging.getLogger(__name__)

HEALTH_PATH = "/health"
# How often a still-waiting trainer says so in its log.
_LOG_EVERY_SECONDS = 60.0


class GenerationUnavailable(RuntimeError):
    """The vLLM server did not answer GET /health with 200 within the start-up budget."""


def lost_server(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a connection to vLLM refused, broken, timed out or
    answered 500/502/503 past the retries: what a dead or replaced server gives."""
    import requests

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, requests.RequestException | ConnectionError | TimeoutError):
            return True
        current = current.__cause__ or current.__context__
    return False


def vllm_healthy(base_url: str, timeout_seconds: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(base_url + HEALTH_PATH, timeout=timeout_seconds) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_for_vllm(
    base_url: str,
    budget_seconds: float,
    *,
    poll_seconds: float = 5.0,
    healthy: Callable[[str], bool] = vllm_healthy,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Block until ``base_url``/health answers 200; return the seconds waited. Raises
    GenerationUnavailable once ``budget_seconds`` have passed without an answer."""
    start = clock()
    next_log = start + _LOG_EVERY_SECONDS
    while True:
        if healthy(base_url):
            waited = clock() - start
            log.info("vLLM server at %s is ready after %.0fs", base_url, waited)
            return waited
        now = clock()
        if now - start >= budget_seconds:
            raise GenerationUnavailable(
                f"vLLM server at {base_url} did not answer GET {HEALTH_PATH} with 200 within "
                f"{budget_seconds:.0f}s (spec.generation.startupTimeoutSeconds): see the vLLM pod's log for "
                "a slow model download or a start-up error, and raise startupTimeoutSeconds if it only needs "
                "longer"
            )
        if now >= next_log:
            log.info(
                "waiting for the vLLM server at %s (%.0fs of %.0fs)", base_url, now - start, budget_seconds
            )
            next_log = now + _LOG_EVERY_SECONDS
        sleep(min(poll_seconds, max(0.0, budget_seconds - (now - start))))
