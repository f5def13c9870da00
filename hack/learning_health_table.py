"""Renders the learning-health table (operator/grpo_operator/api/learning_health.py: ``REASONS``, the
``Thresholds`` defaults and the ``LearningHealthSpec`` field descriptions) into docs/concepts.md, between
the two pairs of markers of its "When a job does not learn" section; ``make generate`` writes it and
tests/unit/test_generated.py fails while the doc differs from the table.
"""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path
from string import Formatter

from grpo_operator.api.learning_health import REASONS, LearningHealthSpec, ReasonInfo, Thresholds

from hack.generated_section import replace_section

REPO = Path(__file__).resolve().parents[1]
OUTPUT = REPO / "docs" / "concepts.md"
SECTION = "When a job does not learn"
REASONS_BEGIN = (
    "<!-- BEGIN generated learning-health table: `make generate` writes it from "
    "operator/grpo_operator/api/learning_health.py (REASONS); edit the table there -->"
)
REASONS_END = "<!-- END generated learning-health table -->"
THRESHOLDS_BEGIN = (
    "<!-- BEGIN generated learning-health thresholds: `make generate` writes them from "
    "operator/grpo_operator/api/learning_health.py (Thresholds, LearningHealthSpec); edit them there -->"
)
THRESHOLDS_END = "<!-- END generated learning-health thresholds -->"
# The placeholders of a `seen` template that are not figures, by the status.learning field they come from.
PLACEHOLDER_NAMES = {"window": "windowSteps"}
# What reads as code in the table's text: a spec or status field path, and a snake_case name (a Prometheus
# metric, a metrics.jsonl field, TRL's completions/clipped_ratio); not inside code already.
IDENTIFIER = re.compile(
    r"(?<![`\w./])((?:spec|status)\.[A-Za-z0-9_.]*[A-Za-z0-9_]|[a-z][a-z0-9]*(?:/[a-z0-9]+)?(?:_[a-z0-9]+)+)(?![`\w])"
)
# Where a field description states its built-in default; the table has a column for it instead.
UNSET = " Unset: "


def seen_in_words(template: str) -> str:
    """A ``seen`` template with each ``{figure:format}`` placeholder written as the figure's name in italics
    (the key it has in status.learning.figures, or the status.learning field for ``{window}``)."""
    out: list[str] = []
    for literal, name, _spec, _conversion in Formatter().parse(template):
        out.append(literal)
        if name is not None:
            out.append(f"*{PLACEHOLDER_NAMES.get(name, name)}*")
    return "".join(out)


def _cell(text: str) -> str:
    """Text for a Markdown table cell: field paths and metric names as code, the separator escaped."""
    return IDENTIFIER.sub(r"`\1`", text).replace("|", "\\|")


def _row(info: ReasonInfo) -> str:
    healthy = "yes" if info.healthy else "**no**"
    alert = f"`{info.alert}`" if info.alert else "—"
    cells = (
        f"`{info.reason}`",
        healthy,
        _cell(seen_in_words(info.seen)),
        _cell(info.read),
        _cell(info.fix),
        alert,
    )
    return "| " + " | ".join(cells) + " |"


def render_reasons() -> str:
    """The table of diagnoses, markers included."""
    lines = [
        REASONS_BEGIN,
        "",
        "| Reason | Healthy | What the trainer saw | How to read the signal | What to change | Alert |",
        "|---|---|---|---|---|---|",
        *(_row(info) for info in REASONS.values()),
        "",
        "Names in italics are the figures of `status.learning.figures` (and `status.learning.windowSteps`) "
        "that the message fills in; `kubectl grpo status` prints them all under the diagnosis.",
        "",
        REASONS_END,
    ]
    return "\n".join(lines)


def default_text(value: object) -> str:
    """A built-in default as the spec writes it (``false``, ``5``, ``0.02``)."""
    return json.dumps(value)


def meaning(description: str | None) -> str:
    """A field's description without its closing "Unset: ..." (the default column says it)."""
    return (description or "").split(UNSET, 1)[0]


def render_thresholds() -> str:
    """The table of spec.grpo.learningHealth's fields with their built-in defaults, markers included."""
    spec_fields = LearningHealthSpec.model_fields
    defaults = Thresholds()
    rows = []
    for field in fields(Thresholds):
        info = spec_fields[field.name]
        value = getattr(defaults, field.name)
        rows.append(f"| `{info.alias}` | `{default_text(value)}` | {_cell(meaning(info.description))} |")
    lines = [
        THRESHOLDS_BEGIN,
        "",
        "| `spec.grpo.learningHealth` field | Built-in default | Meaning |",
        "|---|---|---|",
        *rows,
        "",
        THRESHOLDS_END,
    ]
    return "\n".join(lines)


def render(text: str) -> str:
    """``text`` with both generated parts replaced by the tables as they are now."""
    text = replace_section(text, REASONS_BEGIN, REASONS_END, render_reasons(), OUTPUT, SECTION)
    return replace_section(text, THRESHOLDS_BEGIN, THRESHOLDS_END, render_thresholds(), OUTPUT, SECTION)


def render_text() -> str:
    return render(OUTPUT.read_text(encoding="utf-8"))
