"""The trainer waits for the vLLM server's /health within the start-up budget from trainer.json."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from grpo_metric import MetricServer
from grpo_operator.api import TrainerConfig
from grpo_operator.api.spec import GRPOJobSpec
from grpo_trainer.vllm_wait import GenerationUnavailable, vllm_healthy, wait_for_vllm

from tests.harness.ports import free_port
from tests.trainer.toy import start_trainer, trainer_config


class _FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_waits_as_long_as_vllm_needs_within_the_budget() -> None:
    clock = _FakeClock()
    # vLLM answers only after 25 minutes: far beyond the old fixed 600 s, within the 1800 s default.
    waited = wait_for_vllm(
        "http://gen:8000", 1800, healthy=lambda _: clock.now >= 1500, clock=clock, sleep=clock.sleep
    )
    assert waited == pytest.approx(1500, abs=5)


def test_gives_up_at_the_budget_naming_the_setting() -> None:
    clock = _FakeClock()
    with pytest.raises(GenerationUnavailable, match=r"within 120s \(spec.generation.startupTimeoutSeconds\)"):
        wait_for_vllm("http://gen:8000", 120, healthy=lambda _: False, clock=clock, sleep=clock.sleep)
    assert clock.now == pytest.approx(120)


@pytest.fixture
def health_server() -> Iterator[tuple[str, list[int]]]:
    codes = [503]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(codes[0] if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", codes
    finally:
        server.shutdown()
        server.server_close()


def test_health_is_read_over_http(health_server: tuple[str, list[int]]) -> None:
    url, codes = health_server
    assert not vllm_healthy(url)
    codes[0] = 200
    assert vllm_healthy(url)
    assert wait_for_vllm(url, 5, poll_seconds=0.01) < 5
    assert not vllm_healthy("http://127.0.0.1:9")  # nothing listens: not healthy, no exception


def test_the_budget_comes_from_the_spec_through_trainer_json() -> None:
    spec = GRPOJobSpec.model_validate(
        {
            "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
            "dataset": {"train": "hf://openai/gsm8k:main#train"},
            "grpo": {"groupSize": 4, "promptsPerStep": 2, "steps": 10},
            "metric": {"image": "m:1"},
            "generation": {"startupTimeoutSeconds": 3600},
        }
    )
    config = TrainerConfig.from_spec("ns", "job", None, spec, metric_url="http://m:8080", generation_host="g")
    again = TrainerConfig.model_validate_json(config.dump_json())
    assert again.generation.startup_timeout_seconds == 3600
    default = GRPOJobSpec.model_validate({**spec.to_dict(), "generation": {}})
    assert default.generation.startup_timeout_seconds >= 1800


@pytest.mark.trainer
def test_a_trainer_whose_vllm_never_answers_exits_transient_naming_the_budget(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer
) -> None:
    """The wait is on the trainer's real start-up path: python -m grpo_trainer with backend vllm-server."""
    closed = free_port()  # nothing listens here: vLLM "never becomes ready"
    config = trainer_config(
        tmp_path,
        tiny_model,
        toy_metric.url,
        extra={
            "generation": {
                "backend": "vllm-server",
                "serverHost": "127.0.0.1",
                "serverPort": closed,
                "startupTimeoutSeconds": 3,
            }
        },
    )
    started = time.monotonic()
    process = start_trainer(config, tmp_path / "trainer.log")
    code = process.wait(timeout=300)
    log = (tmp_path / "trainer.log").read_text()
    assert code == 1, log[-3000:]
    assert f"vLLM server at http://127.0.0.1:{closed} did not answer GET /health" in log
    assert "within 3s (spec.generation.startupTimeoutSeconds)" in log
    assert time.monotonic() - started < 240
