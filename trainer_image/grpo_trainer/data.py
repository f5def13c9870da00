"""Training and validation prompts from the dataset URIs of the spec (grpo_operator.api.dataset_uri)."""

from __future__ import annotations

from typing import Any

from grpo_operator.api.dataset_uri import DatasetSource, DatasetURIError, parse_dataset_uri
from grpo_operator.api.prompt_template import fill_template, template_fields
from grpo_operator.api.spec import DatasetSpec

from grpo_trainer.errors import ConfigError


def load_rows(uri: str) -> Any:
    """A datasets.Dataset for ``uri``; every failure becomes a ConfigError naming the URI."""
    import datasets

    try:
        source: DatasetSource = parse_dataset_uri(uri)
    except DatasetURIError as exc:
        raise ConfigError(str(exc)) from None
    try:
        if source.scheme == "file":
            builder = "parquet" if source.file_format == "parquet" else "json"
            return datasets.load_dataset(builder, data_files=source.location, split="train")
        return datasets.load_dataset(
            source.location, source.config, revision=source.revision, split=source.split or "train"
        )
    except FileNotFoundError as exc:
        raise ConfigError(
            f"dataset {uri} not found: {exc}; check spec.dataset and the job's volume"
        ) from None
    except Exception as exc:  # datasets raises many types for unreachable hubs, bad files, bad splits
        raise ConfigError(f"cannot load dataset {uri}: {type(exc).__name__}: {exc}") from None


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def prepare(dataset: Any, spec: DatasetSpec, tokenizer: Any, max_prompt_length: int, uri: str) -> Any:
    """Add the ``prompt`` column TRL reads and keep every other column for the metric.

    Text prompts (spec.promptField) are filled into spec.promptTemplate, cut to their last
    ``max_prompt_length`` tokens, and become a user turn after a spec.systemPrompt system turn when the
    model has a chat template (TRL then applies it), or plain text after the system prompt when it has
    none. Chat-format prompts (lists of {role, content}) get the system turn unless they start with one.
    """
    prompt_field = spec.prompt_field
    if len(dataset) == 0:
        raise ConfigError(f"dataset {uri} has no rows")
    if prompt_field not in dataset.column_names:
        raise ConfigError(
            f"dataset {uri} has no column {prompt_field!r} (spec.dataset.promptField); "
            f"its columns are {dataset.column_names}"
        )
    if spec.prompt_template is not None:
        missing = [
            f
            for f in template_fields(spec.prompt_template)
            if f != "prompt" and f not in dataset.column_names
        ]
        if missing:
            raise ConfigError(
                f"spec.dataset.promptTemplate names {missing} but dataset {uri} has only the columns "
                f"{dataset.column_names} ({{prompt}} is the promptField column)"
            )
    chat = has_chat_template(tokenizer)
    system = spec.system_prompt

    def fix(row: dict[str, Any]) -> dict[str, Any]:
        prompt = row[prompt_field]
        if isinstance(prompt, str):
            if spec.prompt_template is not None:
                prompt = fill_template(spec.prompt_template, row, prompt_field)
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            if len(ids) > max_prompt_length:
                prompt = tokenizer.decode(ids[-max_prompt_length:])
            if chat and spec.apply_chat_template:
                turns = [{"role": "system", "content": system}] if system else []
                return {"prompt": [*turns, {"role": "user", "content": prompt}]}
            return {"prompt": f"{system}\n\n{prompt}" if system else prompt}
        if isinstance(prompt, list) and all(
            isinstance(m, dict) and "role" in m and "content" in m for m in prompt
        ):
            if spec.prompt_template is not None:
                raise ConfigError(
                    f"dataset {uri}: column {prompt_field!r} holds chat messages, which promptTemplate cannot "
                    "fill; put instructions in spec.dataset.systemPrompt instead"
                )
            if not chat:
                raise ConfigError(
                    f"dataset {uri}: column {prompt_field!r} holds chat messages but the tokenizer of the model "
                    "has no chat template to render them; use a chat (instruct) model, or a text column"
                )
            if system and not (prompt and prompt[0]["role"] == "system"):
                prompt = [{"role": "system", "content": system}, *prompt]
            return {"prompt": prompt}
        raise ConfigError(
            f"dataset {uri}: column {prompt_field!r} must hold text or chat messages (a list of "
            f"{{role, content}}), got {type(prompt).__name__}"
        )

    return dataset.map(fix, desc="preparing prompts")
