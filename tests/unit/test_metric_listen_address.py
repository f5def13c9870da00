"""Where a metric image built on the SDK listens: ``serve()`` binds to $GRPO_METRIC_HOST when set (an address
the user chooses, e.g. 127.0.0.1 behind a sidecar), else to all interfaces, which a pod needs for its
Service to reach it. Run as a metric image runs: a process calling ``serve(metric)``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from grpo_metric.protocol import HEALTH_PATH

from tests.harness.ports import free_port

METRIC = "from grpo_metric import serve\nserve(lambda example, completion: 1.0)\n"


@contextmanager
def metric_process(**env: str) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-c", METRIC],
        env={**{k: v for k, v in os.environ.items() if k != "GRPO_METRIC_HOST"}, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield process
    finally:
        process.terminate()
        process.wait(timeout=30)


def answers(host: str, port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{HEALTH_PATH}", timeout=2) as response:
            return int(response.status) == 200
    except OSError:
        return False


def wait_answering(host: str, port: int, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while not answers(host, port):
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline, f"the metric never answered on {host}:{port}"
        time.sleep(0.1)


def test_the_metric_listens_only_on_the_address_the_user_chose() -> None:
    port = free_port()
    with metric_process(GRPO_METRIC_HOST="127.0.0.2", GRPO_METRIC_PORT=str(port)) as process:
        wait_answering("127.0.0.2", port, process)
        # Another loopback address of the same machine: nothing listens there.
        assert not answers("127.0.0.1", port)


def test_by_default_the_metric_listens_on_every_interface() -> None:
    port = free_port()
    with metric_process(GRPO_METRIC_PORT=str(port)) as process:
        wait_answering("127.0.0.1", port, process)
        assert answers("127.0.0.2", port)


@pytest.mark.parametrize("value", ["metric.local", "300.1.2.3", "0.0.0.0:8080"])
def test_a_listen_address_that_is_not_an_ip_address_stops_the_server_with_what_to_set(value: str) -> None:
    with metric_process(GRPO_METRIC_HOST=value, GRPO_METRIC_PORT=str(free_port())) as process:
        output, _ = process.communicate(timeout=60)
    assert process.returncode != 0
    assert f"GRPO_METRIC_HOST={value!r} is not an IP address" in output, output
    assert "127.0.0.1" in output and "0.0.0.0" in output
