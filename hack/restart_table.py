"""Renders the restart policy (operator/grpo_operator/reconcile/restart_policy.py) into docs/operations.md,
between the markers of its "Failures and restarts" section; ``make generate`` writes it and
tests/unit/test_generated.py fails while the doc differs from the table.
"""

from __future__ import annotations

from pathlib import Path

from grpo_operator.reconcile.restart_policy import DEFAULT_PERMANENT_EXIT_CODES, RULES, RestartRule, Trigger

from hack.generated_section import replace_section

REPO = Path(__file__).resolve().parents[1]
OUTPUT = REPO / "docs" / "operations.md"
BEGIN = (
    "<!-- BEGIN generated restart-policy table: `make generate` writes it from "
    "operator/grpo_operator/reconcile/restart_policy.py; edit the table there -->"
)
END = "<!-- END generated restart-policy table -->"


def _cause(rule: RestartRule) -> str:
    seen: list[str] = []
    if rule.condition_reasons:
        seen.append("`DisruptionTarget` reason " + ", ".join(f"`{r}`" for r in rule.condition_reasons))
    if rule.status_reasons:
        seen.append("pod status reason " + ", ".join(f"`{r}`" for r in rule.status_reasons))
    return f"{rule.cause} ({'; '.join(seen)})" if seen else rule.cause


def _row(rule: RestartRule) -> str:
    counted = "—" if rule.permanent else ("yes" if rule.counted else "no")
    permanent = "yes" if rule.permanent else "no"
    cells = (f"`{rule.reason}`", rule.trigger.value, _cause(rule), counted, permanent, rule.meaning)
    return "| " + " | ".join(cells) + " |"


def render_section() -> str:
    """The table and its note, markers included."""
    codes = ",".join(str(code) for code in DEFAULT_PERMANENT_EXIT_CODES)
    exit_reasons = ", ".join(f"`{r.reason}`" for r in RULES if r.trigger is Trigger.EXIT_CODE)
    lines = [
        BEGIN,
        "",
        "| Reason | Seen as | Cause | Counts against `backoffLimit` | Fails the job at once | Meaning |",
        "|---|---|---|---|---|---|",
        *(_row(rule) for rule in RULES),
        "",
        f"Which trainer exit codes fail the job at once ({exit_reasons}) is the operator setting "
        f"`GRPO_OPERATOR_PERMANENT_EXIT_CODES` (default `{codes}`, the rows above that fail at once): a "
        "code taken out of it becomes a counted restart under its row's reason (`TrainerFailed` for 2), "
        "and a code added to it fails the job as `PermanentFailure`.",
        "",
        END,
    ]
    return "\n".join(lines)


def render(text: str) -> str:
    """``text`` with its generated section replaced by the table as it is now."""
    return replace_section(text, BEGIN, END, render_section(), OUTPUT, "Failures and restarts")


def render_text() -> str:
    return render(OUTPUT.read_text(encoding="utf-8"))
