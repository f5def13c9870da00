"""The trainer's requests to vLLM back off for about a minute when the server does not answer; once SIGTERM
has arrived (the gang is being replaced, typically because that server died) the backoff gives up at once,
so the pod goes and the next attempt can start."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from grpo_trainer.signals import StopFlag
from grpo_trainer.vllm_wait import GenerationUnavailable
from grpo_trainer.weight_sync import stop_retrying_when, vllm_session


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once the socket is closed


@pytest.fixture
def stop() -> Iterator[StopFlag]:
    flag = StopFlag()
    stop_retrying_when(flag.is_set)
    yield flag
    stop_retrying_when(lambda: False)


def test_sigterm_ends_the_backoff_toward_a_server_that_does_not_answer(stop: StopFlag) -> None:
    session = vllm_session()
    timer = threading.Timer(1.0, stop.set)
    timer.start()
    started = time.monotonic()
    with pytest.raises(
        GenerationUnavailable, match="SIGTERM arrived while the vLLM server was not answering"
    ):
        session.post(f"http://127.0.0.1:{closed_port()}/v1/completions", json={}, timeout=5)
    # Without SIGTERM the retries back off 2 + 4 + 8 + 16 + 32 s.
    assert time.monotonic() - started < 5


def test_without_sigterm_the_backoff_retries_as_trl_does(stop: StopFlag) -> None:
    retry = vllm_session().get_adapter("http://x").max_retries
    assert (retry.connect, retry.backoff_factor, sorted(retry.status_forcelist)) == (5, 2, [500, 502, 503])


def test_a_trainer_that_rides_out_replacements_sees_a_lost_connection_at_once(stop: StopFlag) -> None:
    """With lost connections left to the caller, a refused connection fails in well under TRL's minute of
    backoff, and is recognised as a lost server; an HTTP answer (the request's own error) is not."""
    import requests
    from grpo_trainer.vllm_wait import lost_server
    from grpo_trainer.weight_sync import WeightSyncError

    session = vllm_session(retry_lost_connections=False)
    started = time.monotonic()
    with pytest.raises(requests.ConnectionError) as refused:
        session.post(f"http://127.0.0.1:{closed_port()}/v1/completions", json={}, timeout=5)
    assert time.monotonic() - started < 2
    assert lost_server(refused.value)
    try:
        raise WeightSyncError("the vLLM server did not reload the weights") from refused.value
    except WeightSyncError as wrapped:
        assert lost_server(wrapped)
    assert not lost_server(Exception("Request failed: 400, prompt too long"))
    retry = session.get_adapter("http://x").max_retries
    assert (retry.connect, retry.read, sorted(retry.status_forcelist)) == (0, 0, [500, 502, 503])
