"""What the plugin prints: every line goes through ``out``, which escapes terminal control characters."""

from __future__ import annotations

import json
import sys
from typing import Any

import yaml

from grpo_operator.kubectl_plugin import render
from grpo_operator.kubectl_plugin.arguments import PROG


def out(text: str, *, err: bool = False, end: str = "\n") -> None:
    """Everything the plugin prints goes through here: much of it was written by the tenant's trainer
    image (files on the volume, the status it patches), so control characters are made visible."""
    stream = sys.stderr if err else sys.stdout
    stream.write(render.terminal_safe(text) + end)
    stream.flush()


def warn(text: str) -> None:
    out(f"{PROG}: warning: {text}", err=True)


def emit(value: Any, output: str | None) -> None:
    if output == "yaml":
        out(yaml.safe_dump(value, sort_keys=False, allow_unicode=True), end="")
    else:
        out(json.dumps(value, indent=2, ensure_ascii=False))


def where(job: dict[str, Any]) -> str:
    status = job.get("status") or {}
    step = (status.get("progress") or {}).get("display") or "no step yet"
    return f"job {job['metadata']['name']} is {status.get('phase') or 'Pending'}, step {step}"
