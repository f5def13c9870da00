"""Every Event the operator posts has a reason from the one catalog (api/event_reasons.py), with the
catalog's type; `kubectl grpo status` lists exactly the catalog's restart and failure events; the docs
show the catalog as it is."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest
from grpo_operator.api import event_reasons
from grpo_operator.api.event_reasons import BY_REASON, EVENT_REASONS, RESTART_OR_FAILURE_REASONS
from grpo_operator.kubectl_plugin.cli import RESTART_REASONS
from grpo_operator.reconcile.restart_policy import RULES

from hack import catalog_tables
from tests.unit.test_restart_policy import SCENARIOS

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "grpo_operator"
EVENT_TYPES = ("Normal", "Warning")


def _sources(layer: str) -> list[Path]:
    return sorted((PACKAGE / layer).rglob("*.py"))


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', '?')}"


def _catalog_names() -> set[str]:
    return {
        name for name, value in vars(event_reasons).items() if isinstance(value, event_reasons.EventReason)
    }


def _is_catalog_constant(node: ast.expr) -> bool:
    """``event_reasons.NAME`` for a constant of the catalog."""
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "event_reasons"
        and node.attr in _catalog_names()
    )


def test_reconcile_posts_events_only_from_the_catalog() -> None:
    """``ReconcilePass.event`` takes an EventReason (mypy holds the call sites to it); here no call passes a
    literal, and no plan Event is built from literals behind its back."""
    literal_reasons: list[str] = []
    built_by_hand: list[str] = []
    calls = 0
    for path in _sources("reconcile"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "event"
            ):
                calls += 1
                first = node.args[0] if node.args else None
                # A catalog constant, or a name or attribute holding one (``rule.event``, ``wait``): mypy
                # checks those are EventReasons. A literal or a made-up catalog name is not.
                named_in_catalog = (
                    isinstance(first, ast.Attribute)
                    and isinstance(first.value, ast.Name)
                    and first.value.id == "event_reasons"
                )
                if not isinstance(first, ast.Attribute | ast.Name) or (
                    named_in_catalog and not _is_catalog_constant(first)
                ):
                    literal_reasons.append(_where(path, node))
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "Event"
                and any(isinstance(arg, ast.Constant) for arg in node.args[:2])
            ):
                built_by_hand.append(_where(path, node))
    assert calls >= 15, "the walk found too few step.event calls: has the API changed?"
    assert not literal_reasons, (
        f"events posted with a reason not from api/event_reasons.py: {literal_reasons}"
    )
    assert not built_by_hand, (
        f"plan Events built from literals instead of ReconcilePass.event: {built_by_hand}"
    )


def test_every_event_the_runtime_posts_itself_is_in_the_catalog() -> None:
    """The runtime posts events of its own (a child the API server refused) as (type, reason, message)."""
    posted: list[tuple[str, str, str]] = []
    for path in _sources("runtime"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            items = (
                node.elts if isinstance(node, ast.Tuple) else node.args if isinstance(node, ast.Call) else []
            )
            for kind, reason in itertools.pairwise(items):
                if isinstance(kind, ast.Constant) and kind.value in EVENT_TYPES:
                    if isinstance(reason, ast.Constant) and isinstance(reason.value, str):
                        posted.append((kind.value, reason.value, _where(path, node)))
                    elif not _is_catalog_constant(reason) and not (
                        isinstance(reason, ast.Attribute) and _is_catalog_constant(reason.value)
                    ):
                        pytest.fail(f"{_where(path, node)}: an event reason that is not from the catalog")
    for type_, name, where in posted:
        assert name in BY_REASON, f"{where}: event reason {name!r} is not in api/event_reasons.py"
        assert BY_REASON[name].type == type_, f"{where}: {name} is a {BY_REASON[name].type} event"


@pytest.mark.parametrize("reason", sorted(SCENARIOS))
def test_events_of_every_restart_scenario_match_the_catalog(reason: str) -> None:
    _, plan = SCENARIOS[reason]()
    assert plan.events, "each restart or failure posts at least one event"
    for event in plan.events:
        assert event.reason in BY_REASON, f"{event.reason} is posted but not in api/event_reasons.py"
        assert event.type == BY_REASON[event.reason].type


def test_catalog_reasons_are_unique_and_the_restart_rules_post_catalog_events() -> None:
    reasons = [r.reason for r in EVENT_REASONS]
    assert len(reasons) == len(set(reasons))
    assert {name for name in _catalog_names()} == {
        name for name, value in vars(event_reasons).items() if value in EVENT_REASONS
    }, "a catalog constant is missing from EVENT_REASONS"
    for rule in RULES:
        if rule.event is not None:
            assert rule.event in EVENT_REASONS and rule.event.reason == rule.reason


def test_kubectl_grpo_status_lists_the_restart_and_failure_events_the_operator_posts() -> None:
    assert RESTART_REASONS == RESTART_OR_FAILURE_REASONS
    # Reasons of the restart policy that are only ever status reasons, never events.
    assert "BackoffLimitExceeded" not in RESTART_REASONS and "NodeLost" not in RESTART_REASONS
    # A trainer out of GPU memory: both the cause and the failure are among the listed events.
    _, plan = SCENARIOS["OutOfMemory"]()
    listed = [e.reason for e in plan.events if e.reason in RESTART_REASONS]
    assert listed == ["OutOfMemory", "Failed"]
    _, plan = SCENARIOS["NonFiniteTraining"]()
    assert [e.reason for e in plan.events if e.reason in RESTART_REASONS] == [
        "NonFiniteTraining",
        "Restarting",
    ]


def test_the_operations_doc_shows_every_event_reason() -> None:
    text = catalog_tables.OPERATIONS_DOC.read_text(encoding="utf-8")
    assert catalog_tables.render_events() in text, "docs/operations.md is stale: run `make generate`"
    for reason in EVENT_REASONS:
        assert f"| `{reason.reason}` | {reason.type} |" in text
