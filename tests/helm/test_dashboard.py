"""The Grafana dashboard: generated, complete, and every metric it queries is one somebody exports.

Exported names come from the code itself: the trainer's registry (grpo_trainer.prom) and the operator's
(grpo_operator.observability), instantiated here; vLLM's names are listed below, and
tests/trainer/test_vllm_weight_sync.py checks the dashboard's vLLM names against the /metrics of the real
vLLM build the tests run. tests/helm/test_monitoring_e2e.py then runs every query against a real
Prometheus that scraped the operator and a CPU training run.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from grpo_operator.observability import OperatorMetrics
from grpo_trainer.prom import TrainerMetrics
from prometheus_client import CollectorRegistry

from hack.helm import dashboard
from tests.helm.chart import CHART, metric_names

# vLLM's Prometheus names (vllm/v1/metrics/loggers.py, docs/design/metrics.md); counters are exposed
# with _total by prometheus_client. Only these may appear in vLLM panels.
VLLM_METRICS = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:num_preemptions_total",
}


def exposed_names(registry: CollectorRegistry) -> set[str]:
    names: set[str] = set()
    for family in registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names.update(family.name + suffix for suffix in ("_bucket", "_sum", "_count"))
        else:
            names.add(family.name)
    return names


def trainer_names() -> set[str]:
    return exposed_names(TrainerMetrics.create("job", "ns").registry)


def operator_names() -> set[str]:
    return exposed_names(OperatorMetrics(lambda: {}).registry)


def queries(model: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in model["panels"] if p["type"] != "row" for t in p["targets"]]


@pytest.fixture(scope="module")
def model() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CHART / "files" / "dashboards" / "grpo-operator.json").read_text())
    return loaded


def test_checked_in_json_is_what_the_generator_writes() -> None:
    assert dashboard.OUTPUT.read_text() == dashboard.render_text(), "run `python hack/helm/dashboard.py`"


def test_every_queried_metric_is_exported_by_the_trainer_the_operator_or_vllm(model: dict[str, Any]) -> None:
    known = trainer_names() | operator_names() | VLLM_METRICS
    for title, expr in queries(model):
        unknown = metric_names(expr) - known
        assert not unknown, f"panel {title!r} queries {sorted(unknown)}, which nobody exports"


def test_the_dashboard_covers_the_signals_the_issue_lists(model: dict[str, Any]) -> None:
    used = set().union(*(metric_names(expr) for _, expr in queries(model)))
    for name in (
        "grpo_reward_mean",
        "grpo_reward_std",
        "grpo_validation_reward_mean",
        "grpo_learning_health",
        "grpo_format_failures_total",
        "grpo_metric_errors_total",
        "grpo_zero_std_groups_total",
        "grpo_groups_total",
        "grpo_step_duration_seconds_count",
        "grpo_step_duration_seconds_bucket",
        "grpo_completion_length_tokens",
        "grpo_kl",
        "grpo_clip_ratio_low",
        "grpo_clip_ratio_high",
        "grpo_entropy",
        "grpo_truncated_completion_ratio",
        "grpo_importance_sampling_ratio_mean",
        "grpo_importance_sampling_masked_ratio",
        "grpo_rollouts_total",
        "grpo_tokens_total",
        "grpo_last_checkpoint_timestamp_seconds",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "grpo_operator_reconcile_total",
        "grpo_operator_reconcile_duration_seconds_bucket",
        "grpo_operator_jobs",
    ):
        assert name in used, f"no panel shows {name}"


def test_variables_and_datasource(model: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    assert variables["namespace"]["multi"] and variables["grpojob"]["multi"]
    assert "$namespace" in variables["grpojob"]["query"]["query"]
    for panel in model["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"], panel["title"]
        assert panel["description"], panel["title"]
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            if any(n.startswith(("grpo_", "vllm:")) and not n.startswith("grpo_operator_") for n in names):
                assert 'namespace=~"$namespace"' in target["expr"], (panel["title"], target["expr"])
                assert 'grpojob=~"$grpojob"' in target["expr"], (panel["title"], target["expr"])


def test_panels_do_not_overlap(model: dict[str, Any]) -> None:
    cells: set[tuple[int, int]] = set()
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids))
    for panel in model["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, panel["title"]
        cells |= mine
