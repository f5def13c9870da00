"""Renders the exit-code catalog (operator/grpo_operator/api/exit_codes.py) into docs/trainer.md ("Exit
codes") and the event-reason catalog (api/event_reasons.py) into docs/operations.md ("Events"), each
between its markers; ``make generate`` writes them and tests/unit/test_generated.py fails while a doc
differs from its catalog.

The exit-code table's "Operator" column is what the restart policy (reconcile/restart_policy.py) does
with the code under the default permanent codes, so the doc cannot say one thing while reconcile does
another.
"""

from __future__ import annotations

from pathlib import Path

from grpo_operator.api.event_reasons import EVENT_REASONS
from grpo_operator.api.exit_codes import EXIT_CODES, ExitCode, ExitCodeEntry
from grpo_operator.reconcile.restart_policy import (
    DEFAULT_PERMANENT_EXIT_CODES,
    TRAINER_FAILED,
    trainer_exit,
)

from hack import restart_table
from hack.generated_section import replace_section

REPO = Path(__file__).resolve().parents[1]
TRAINER_DOC = REPO / "docs" / "trainer.md"
OPERATIONS_DOC = restart_table.OUTPUT

EXIT_BEGIN = (
    "<!-- BEGIN generated exit-code table: `make generate` writes it from "
    "operator/grpo_operator/api/exit_codes.py and reconcile/restart_policy.py; edit them there -->"
)
EXIT_END = "<!-- END generated exit-code table -->"
EVENTS_BEGIN = (
    "<!-- BEGIN generated event table: `make generate` writes it from "
    "operator/grpo_operator/api/event_reasons.py; edit the catalog there -->"
)
EVENTS_END = "<!-- END generated event table -->"


def _operator_does(entry: ExitCodeEntry) -> str:
    if entry.code is ExitCode.OK:
        return "trainer rank 0 exiting 0 ends the job `Succeeded`; after SIGTERM the job resumes later"
    rule = trainer_exit(entry.code, DEFAULT_PERMANENT_EXIT_CODES) or TRAINER_FAILED
    if rule.permanent:
        return f"fails the job at once: `Failed`/`{rule.reason}`"
    counted = "counted" if rule.counted else "uncounted"
    return f"{counted} restart `{rule.reason}` from the last checkpoint"


def render_exit_codes() -> str:
    """The exit-code table, markers included."""
    rows = [f"| {int(e.code)} | {e.meaning} | {_operator_does(e)} |" for e in EXIT_CODES]
    return "\n".join([EXIT_BEGIN, "", "| Code | Meaning | Operator |", "|---|---|---|", *rows, "", EXIT_END])


def render_events() -> str:
    """The event table, markers included."""
    rows = [
        f"| `{r.reason}` | {r.type} | {r.when}{' Listed by `kubectl grpo status`.' if r.restart_or_failure else ''} |"
        for r in EVENT_REASONS
    ]
    return "\n".join([EVENTS_BEGIN, "", "| Reason | Type | When |", "|---|---|---|", *rows, "", EVENTS_END])


def render_trainer_text() -> str:
    """docs/trainer.md with its exit-code table as the catalog is now."""
    text = TRAINER_DOC.read_text(encoding="utf-8")
    return replace_section(text, EXIT_BEGIN, EXIT_END, render_exit_codes(), TRAINER_DOC, "Exit codes")


def render_operations_text() -> str:
    """docs/operations.md with both its generated tables (restart policy and events) as they are now."""
    text = restart_table.render_text()
    return replace_section(text, EVENTS_BEGIN, EVENTS_END, render_events(), OPERATIONS_DOC, "Events")
