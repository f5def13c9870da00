"""Renders the alert table of docs/runbooks/README.md from the chart's defaults
(helm/grpo-operator/values.yaml, ``prometheusRule.alerts``): name, severity, and when it fires with the
thresholds and durations the chart ships. ``make generate`` writes it; tests/unit/test_generated.py fails
while the page differs, and rendering fails when an alert has no runbook page or a page no alert.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hack.generated_section import replace_section

REPO = Path(__file__).resolve().parents[1]
OUTPUT = REPO / "docs" / "runbooks" / "README.md"
VALUES = REPO / "helm" / "grpo-operator" / "values.yaml"
BEGIN = (
    "<!-- BEGIN generated alert table: `make generate` writes it from helm/grpo-operator/values.yaml "
    "(prometheusRule.alerts) and hack/runbook_index.py -->"
)
END = "<!-- END generated alert table -->"

# What each alert watches; the numbers come from the chart's values.
FIRES_WHEN: dict[str, str] = {
    "GRPOJobNoLearningSignal": "> {threshold:.0%} of groups have all-equal rewards over {window}, for {for}",
    "GRPOJobFormatFailureRatioHigh": "> {threshold:.0%} of completions are unparseable over {window}, for {for}",
    "GRPOJobCompletionsTruncated": "> {threshold:.0%} of completions cut off at maxCompletionLength over {window}, "
    "for {for}",
    "GRPOJobUpdatesVanishing": "no optimizer step changed {threshold:.0%} of the sampled weights over {window}, "
    "for {for}",
    "GRPOJobMetricErrors": "> {threshold:.0%} of completions cannot be scored over {window}, for {for}",
    "GRPOJobKLRunaway": "the mean per-token KL to the reference model is > {threshold} nats over {window}, "
    "for {for}",
    "GRPOJobValidationFalling": "the trainer diagnoses ValidationFalling (validation down, training reward up), "
    "for {for}",
    "GRPOJobNotLearning": "the trainer's learning-health diagnosis is one that needs a change, for {for}",
    "GRPOJobServedModelDrift": "a weight sync left vLLM serving other weights within {window}, for {for}",
    "GRPOJobTrainingStalled": "no training step for {thresholdSeconds:duration} while steps remain, for {for}",
    "GRPOJobCheckpointStale": "steps continue but no checkpoint for {thresholdSeconds:duration}, for {for}",
    "GRPOJobFailed": "a GRPOJob is in phase Failed",
    "GRPOJobStuckPending": "a GRPOJob has been Pending for {for}",
    "GRPONamespaceOverMonthlyAmount": "a namespace spent more than its amount (pricing.currency) over {window}, for {for}",
    "GRPOOperatorReconcileErrors": "> {threshold:.0%} of reconciles fail over {window}, for {for}",
    "GRPOOperatorDown": "the operator has not been scraped successfully for {for}",
}


class RunbookIndexError(ValueError):
    """The alerts, their pages and this index disagree."""


def _duration(seconds: int) -> str:
    if seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def _fires_when(name: str, alert: dict[str, Any]) -> str:
    fields = {k: (_Seconds(v) if k == "thresholdSeconds" else v) for k, v in alert.items()}
    return FIRES_WHEN[name].format(**fields)


class _Seconds(int):
    def __format__(self, spec: str) -> str:
        return _duration(int(self)) if spec == "duration" else format(int(self), spec)


def alerts() -> dict[str, dict[str, Any]]:
    values = yaml.safe_load(VALUES.read_text(encoding="utf-8"))
    return dict(values["prometheusRule"]["alerts"])


def render_section() -> str:
    found = alerts()
    pages = {p.stem for p in OUTPUT.parent.glob("*.md") if p.name != OUTPUT.name}
    problems = []
    if set(found) != set(FIRES_WHEN):
        problems.append(f"alerts in values.yaml {sorted(found)} != described in hack/runbook_index.py")
    if set(found) != pages:
        problems.append(
            f"alerts without a page: {sorted(set(found) - pages)}; pages without an alert: "
            f"{sorted(pages - set(found))}"
        )
    if problems:
        raise RunbookIndexError(
            "; ".join(problems) + ": add the page (docs/runbooks/<Alert>.md) or the description"
        )
    rows = [
        f"| [{name}]({name}.md) | {alert['severity']} | {_fires_when(name, alert)} |"
        for name, alert in found.items()
    ]
    return "\n".join([BEGIN, "", "| Alert | Severity | Fires when |", "|---|---|---|", *rows, "", END])


def render(text: str) -> str:
    return replace_section(text, BEGIN, END, render_section(), OUTPUT, "Runbooks")


def render_text() -> str:
    return render(OUTPUT.read_text(encoding="utf-8"))
