"""Prompt formats: text prompts through a template and the model's chat template, chat-format datasets, and
a system prompt for both; what the model finally sees is rendered by TRL's own maybe_apply_chat_template,
the function GRPOTrainer applies to every prompt."""

from __future__ import annotations

from typing import Any

import pytest
from grpo_operator.api.spec import DatasetSpec
from grpo_trainer.data import prepare
from grpo_trainer.errors import ConfigError

pytestmark = pytest.mark.trainer

# A chat template in the style of ChatML (Qwen's), small enough to read in an assertion.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SYSTEM = "Solve step by step. End with a line '#### <number>'."
ROW = {"question": "What is 2+3?", "answer": "#### 5", "level": "easy"}


def tokenizer(chat: bool) -> Any:
    from grpo_trainer.tiny import build_tokenizer

    tok: Any = build_tokenizer()
    if chat:
        tok.chat_template = CHATML
    return tok


def dataset(rows: list[dict[str, Any]]) -> Any:
    import datasets

    return datasets.Dataset.from_list(rows)


def spec(**fields: Any) -> DatasetSpec:
    return DatasetSpec.model_validate(
        {"train": "file:///data/train.jsonl", "promptField": "question", **fields}
    )


def seen_by_model(row: dict[str, Any], tok: Any) -> str:
    from trl.data_utils import maybe_apply_chat_template

    return str(maybe_apply_chat_template({"prompt": row["prompt"]}, tok)["prompt"])


def test_text_prompt_with_template_and_system_prompt_goes_through_the_chat_template() -> None:
    tok = tokenizer(chat=True)
    s = spec(systemPrompt=SYSTEM, promptTemplate="Question ({level}): {prompt}\nAnswer:")
    (row,) = prepare(dataset([ROW]), s, tok, 512, "train")
    assert seen_by_model(row, tok) == (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
        "<|im_start|>user\nQuestion (easy): What is 2+3?\nAnswer:<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert row["answer"] == "#### 5"  # the metric still gets every column


def test_text_prompt_without_a_chat_template_is_plain_text_after_the_system_prompt() -> None:
    tok = tokenizer(chat=False)
    (row,) = prepare(dataset([ROW]), spec(systemPrompt=SYSTEM), tok, 512, "train")
    assert seen_by_model(row, tok) == f"{SYSTEM}\n\nWhat is 2+3?"


def test_apply_chat_template_false_keeps_raw_text() -> None:
    tok = tokenizer(chat=True)
    (row,) = prepare(dataset([ROW]), spec(applyChatTemplate=False), tok, 512, "train")
    assert seen_by_model(row, tok) == "What is 2+3?"


def test_chat_format_dataset_gets_the_system_prompt_unless_it_has_one() -> None:
    tok = tokenizer(chat=True)
    plain = {"question": [{"role": "user", "content": "What is 2+3?"}], "answer": "5"}
    own = {
        "question": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "What is 2+3?"}],
        "answer": "5",
    }
    first, second = prepare(dataset([plain, own]), spec(systemPrompt=SYSTEM), tok, 512, "train")
    assert seen_by_model(first, tok).startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n")
    assert seen_by_model(second, tok).startswith(
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\n"
    )
    assert SYSTEM not in seen_by_model(second, tok)


@pytest.mark.parametrize(
    ("rows", "fields", "chat", "message"),
    [
        ([ROW], {"promptTemplate": "{prompt} ({topic})"}, True, "names ['topic'] but dataset train has only"),
        (
            [{"question": [{"role": "user", "content": "hi"}]}],
            {"promptTemplate": "Q: {prompt}"},
            True,
            "put instructions in spec.dataset.systemPrompt",
        ),
        ([{"question": [{"role": "user", "content": "hi"}]}], {}, False, "has no chat template"),
        ([{"question": 7}], {}, True, "must hold text or chat messages"),
    ],
)
def test_unusable_prompt_formats_are_configuration_errors(
    rows: list[dict[str, Any]], fields: dict[str, Any], chat: bool, message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        prepare(dataset(rows), spec(**fields), tokenizer(chat), 512, "train")
