"""Training and validation prompts from the dataset URIs of the spec (grpo_operator.api.dataset_uri)."""

from __future__ import annotations

from typing import Any

from grpo_operator.api.dataset_uri import DatasetSource, DatasetURIError, parse_dataset_uri

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


def prepare(dataset: Any, prompt_field: str, tokenizer: Any, max_prompt_length: int, uri: str) -> Any:
    """Add the ``prompt`` column TRL reads (from ``prompt_field``), keep every other column for the metric,
    and keep only the last ``max_prompt_length`` tokens of over-long text prompts."""
    if len(dataset) == 0:
        raise ConfigError(f"dataset {uri} has no rows")
    if prompt_field not in dataset.column_names:
        raise ConfigError(
            f"dataset {uri} has no column {prompt_field!r} (spec.dataset.promptField); "
            f"its columns are {dataset.column_names}"
        )

    def fix(row: dict[str, Any]) -> dict[str, Any]:
        prompt = row[prompt_field]
        if isinstance(prompt, str):
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            if len(ids) > max_prompt_length:
                prompt = tokenizer.decode(ids[-max_prompt_length:])
        elif not isinstance(prompt, list):
            raise ConfigError(
                f"dataset {uri}: column {prompt_field!r} must hold text or chat messages, got {type(prompt).__name__}"
            )
        return {"prompt": prompt}

    return dataset.map(fix, desc="preparing prompts")
