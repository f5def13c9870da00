from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from grpo_metric import MetricServer

from tests.harness import vllm_server
from tests.trainer.client_toy import CHAT_TEMPLATE
from tests.trainer.toy import fraction_of_target


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from grpo_trainer.tiny import build

    return build(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture
def toy_metric() -> Iterator[MetricServer]:
    with MetricServer(fraction_of_target) as server:
        yield server


@pytest.fixture(scope="session")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from grpo_trainer.tiny import build
    from transformers import AutoTokenizer

    path = build(tmp_path_factory.mktemp("tiny-chat-model"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def served_tiny(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[vllm_server.VLLMProcess]:
    """One vLLM server of the untied tiny model for every module that trains against it (weight sync,
    episodes). Sharing is safe: each run's first sync replaces all the served weights, so a run never
    samples what an earlier one trained. The modules that start vLLM run one after another on one worker
    (tests/conftest.py), so one server saves a start-up per module. It is rendered for weightSync Broadcast
    (the project's weight-transfer engine started), so the broadcast tests use it as well; the volume's
    reload needs nothing of the engine."""
    from tests.trainer.vllm_runs import serve

    server = serve(tiny_model, tmp_path_factory.mktemp("vllm-tiny"), weight_sync="Broadcast")
    yield server
    server.stop()
