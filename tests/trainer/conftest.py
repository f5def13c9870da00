from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from grpo_metric import MetricServer

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
