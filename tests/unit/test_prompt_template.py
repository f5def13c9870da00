"""spec.dataset.promptTemplate: a bad template is refused when the job is admitted, not hours later by the
trainer; a good one fills {column} placeholders and keeps escaped braces."""

from __future__ import annotations

import pytest
from grpo_operator.api.prompt_template import fill_template
from grpo_operator.api.spec import DatasetSpec
from pydantic import ValidationError


def dataset(**fields: object) -> DatasetSpec:
    return DatasetSpec.model_validate({"train": "hf://openai/gsm8k:main#train", **fields})


def test_template_fills_columns_and_keeps_literal_braces() -> None:
    row = {"question": "2+3?", "level": "easy", "prompt": "not this one"}
    text = fill_template('[{level}] {prompt} Reply as {{"answer": n}}', row, "question")
    assert text == '[easy] 2+3? Reply as {"answer": n}'


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("Solve it.", "has no placeholder"),
        ("Q: {prompt} {", "brace that is not a {column} placeholder"),
        ("Q: {the question}", "brace that is not a {column} placeholder"),
    ],
)
def test_unusable_templates_are_refused_with_the_fix(template: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("{", r"\{").replace("}", r"\}")):
        dataset(promptTemplate=template)


def test_prompt_format_fields_default_to_the_dataset_as_it_is() -> None:
    spec = dataset()
    assert spec.system_prompt is None and spec.prompt_template is None and spec.apply_chat_template is True
