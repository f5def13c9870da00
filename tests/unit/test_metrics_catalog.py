"""docs/metrics.md is the catalog of every Prometheus metric the project exports: the trainer's
(``TrainerMetrics``) and the operator's (``OperatorMetrics``), read from their real registries. Any other
doc table listing ``grpo_`` metrics must agree with them too."""

from __future__ import annotations

import re
from pathlib import Path

from grpo_operator.api.pricing import Showback
from grpo_operator.observability import OperatorMetrics
from grpo_trainer.prom import LABELS, TrainerMetrics
from prometheus_client import CollectorRegistry

REPO = Path(__file__).resolve().parents[2]
METRICS_MD = REPO / "docs" / "metrics.md"
ROW = re.compile(r"^\|\s*`(grpo_\w+)`\s*\|\s*(\w+)\s*\|([^|]*)\|")


def exported(registry: CollectorRegistry) -> dict[str, tuple[str, set[str]]]:
    """{name as written in PromQL: (type, label names)}; counters carry their ``_total`` suffix."""
    out: dict[str, tuple[str, set[str]]] = {}
    for family in registry.collect():
        name = family.name + "_total" if family.type == "counter" else family.name
        labels = {label for sample in family.samples for label in sample.labels if label not in ("le",)}
        out[name] = (family.type, labels)
    return out


def trainer_metrics() -> dict[str, tuple[str, set[str]]]:
    metrics = TrainerMetrics.create("job", "ns")
    # The component and learning-health gauges have no samples until set: set each so its label names show.
    metrics.set_component("accuracy", 0.5)
    metrics.set_learning_health("Healthy")
    return exported(metrics.registry)


def operator_metrics() -> dict[str, tuple[str, set[str]]]:
    # A job with prices and both limits, so every showback series has a sample.
    showback = Showback(60, 30, amount=1.5, currency="USD", budget_gpu_hours=1, budget_amount=10)
    metrics = OperatorMetrics(lambda: {("ns", "job"): "Running"}, lambda: {("ns", "job"): showback})
    # Labelled counters have no samples until used: touch each one so its label names show.
    metrics.reconciles.labels(result="success").inc()
    metrics.restarts.labels(namespace="ns", grpojob="job", reason="r", counted="true").inc()
    metrics.api_errors.labels(verb="get", kind="Pod", code="500").inc()
    metrics.api_requests.labels(verb="create", resource="pods").inc()
    metrics.events.labels(type="Normal", reason="Created").inc()
    return exported(metrics.registry)


def documented(path: Path) -> dict[str, tuple[str, str]]:
    """{metric: (type, labels cell)} of every table row of a doc that starts with a `grpo_` metric."""
    rows: dict[str, tuple[str, str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = ROW.match(line)
        if match:
            name, kind, third = match.groups()
            assert name not in rows, f"{path.name} lists {name} twice"
            rows[name] = (kind, third)
    return rows


def test_metrics_md_lists_every_trainer_and_operator_metric_with_its_type() -> None:
    catalog = documented(METRICS_MD)
    code = {**trainer_metrics(), **operator_metrics()}
    missing = sorted(set(code) - set(catalog))
    assert not missing, f"exported but not in docs/metrics.md: {missing}; add a row for each"
    stale = sorted(set(catalog) - set(code))
    assert not stale, f"docs/metrics.md lists {stale}, which neither the trainer nor the operator exports"
    wrong = {name: (catalog[name][0], code[name][0]) for name in code if catalog[name][0] != code[name][0]}
    assert not wrong, f"type in docs/metrics.md differs from the code (doc, code): {wrong}"


def test_every_trainer_series_carries_the_documented_job_labels() -> None:
    catalog = documented(METRICS_MD)
    for name, (_, labels) in trainer_metrics().items():
        # A label beyond the job's two must be named in the metric's row, as `label`.
        extra = labels - set(LABELS)
        said = set(re.findall(r"label `(\w+)`", catalog[name][1]))
        assert set(LABELS) <= labels and extra == said, (
            f"{name} has labels {sorted(labels)}; docs/metrics.md promises {LABELS} plus {sorted(said)}"
        )


def test_the_documented_operator_labels_are_the_exported_ones() -> None:
    for path in (METRICS_MD, REPO / "docs" / "operations.md"):
        for name, (_, cell) in documented(path).items():
            if not name.startswith("grpo_operator_"):
                continue
            said = set(re.findall(r"`(\w+)`", cell))
            actual = operator_metrics()[name][1]
            assert said == actual, f"{path.name}: {name} labels {sorted(said)}, exported {sorted(actual)}"


def test_other_docs_name_only_metrics_that_exist() -> None:
    code = {**trainer_metrics(), **operator_metrics()}
    for path in sorted((REPO / "docs").rglob("*.md")):
        for name, (kind, _) in documented(path).items():
            assert name in code, f"{path.relative_to(REPO)} has a table row for {name}, which nothing exports"
            assert kind == code[name][0], f"{path.relative_to(REPO)}: {name} is a {code[name][0]}, not {kind}"
