"""Prompt templates (spec.dataset.promptTemplate): checked when a job is admitted, filled by the trainer."""

from __future__ import annotations

import re
from collections.abc import Mapping

from grpo_operator.api.base import CelRule

_TEMPLATE_FIELD = re.compile(r"\{(\w+)\}")


_STRAY_BRACE = (
    "promptTemplate has a brace that is not a {column} placeholder: write a placeholder as {name} "
    "(letters, digits, _) and a literal brace as {{ or }}"
)
_NO_PLACEHOLDER = (
    "promptTemplate has no placeholder, so every prompt would be the same text: put {prompt} (the "
    "promptField column) or another {column} where the row's text goes"
)
# The API server's twin of template_fields, so `kubectl apply` refuses what the operator would.
_UNESCAPED = "self.replace('{{', '').replace('}}', '')"
PROMPT_TEMPLATE_RULES = (
    CelRule(_UNESCAPED + r".matches(r'^[^{}]*(\{\w+\}[^{}]*)*$')", _STRAY_BRACE),
    CelRule(_UNESCAPED + r".matches(r'\{\w+\}')", _NO_PLACEHOLDER),
)


def template_fields(template: str) -> list[str]:
    """The {column} placeholders of a prompt template; ValueError for a stray brace or none at all."""
    bare = _TEMPLATE_FIELD.sub("", template.replace("{{", "").replace("}}", ""))
    if "{" in bare or "}" in bare:
        raise ValueError(_STRAY_BRACE)
    fields = _TEMPLATE_FIELD.findall(template.replace("{{", "").replace("}}", ""))
    if not fields:
        raise ValueError(_NO_PLACEHOLDER)
    return fields


def fill_template(template: str, row: Mapping[str, object], prompt_field: str) -> str:
    """``template`` with each {column} replaced by the row's value ({prompt}: the promptField column)."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        return str(row[prompt_field if name == "prompt" else name])

    parts = template.split("{{")
    return "{".join(
        "}".join(_TEMPLATE_FIELD.sub(value, chunk) for chunk in part.split("}}")) for part in parts
    )
