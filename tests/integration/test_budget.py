"""spec.budget against a real API server and the operator running for real: a job whose status.cost passes
its budget is warned, then suspended with its volume and checkpoint kept, and a raised budget resumes it from
that checkpoint. The tests play trainer rank 0 by writing status.cost and status.checkpoint, as
tests/integration/test_operator.py describes."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from grpo_operator.api.budget import spent_gpu_hours
from prometheus_client.parser import text_string_to_metric_families

from tests.harness.kube import Cluster, wait_for
from tests.harness.local_runner import LocalJobRunner
from tests.harness.operator_process import Operator
from tests.integration.operator_helpers import (
    CKPT,
    events_of,
    gang,
    patch_job_status,
    report_checkpoint,
    run_job,
    running_operator,
    status,
    wait_event,
    wait_reasons,
    wait_resumed_from,
    wait_status,
)
from tests.integration.test_e2e_training import METRIC_IMAGE, run_tiny_job, tiny_job

pytestmark = pytest.mark.slow


def report_cost(
    kube: Cluster, namespace: str, name: str, generation_seconds: float, training_seconds: float
) -> None:
    """What trainer rank 0 writes after a step: the GPU-seconds so far."""
    cost = {"generationGpuSeconds": generation_seconds, "trainingGpuSeconds": training_seconds}
    patch_job_status(kube, namespace, name, {"cost": cost})


def patch_budget(kube: Cluster, namespace: str, name: str, budget: dict[str, float]) -> None:
    """What the job's owner does to raise (or set) its budget."""
    body = json.dumps({"spec": {"budget": budget}})
    kube.kubectl("patch", "grpojob", name, "-n", namespace, "--type=merge", "-p", body)


def test_a_job_over_its_budget_is_suspended_and_a_raised_budget_resumes_it(
    kube: Cluster, namespace: str, operator: Operator
) -> None:
    run_job(kube, namespace, "math", budget={"gpuHours": 1})
    report_checkpoint(kube, namespace, "math", 5, CKPT)

    report_cost(kube, namespace, "math", 1800, 1260)  # 0.85 GPU-hours: past the default 80 %
    warning = wait_event(kube, namespace, "math", "BudgetNearlySpent")
    assert warning["type"] == "Warning" and "spent 0.85 of its 1 GPU-hours" in warning["message"]
    assert status(kube, namespace, "math")["phase"] == "Running"

    report_cost(kube, namespace, "math", 2400, 1308)  # 1.03 GPU-hours
    s = wait_status(
        kube, namespace, "math", "suspended by its budget", lambda s: s.get("reason") == "BudgetExhausted"
    )
    assert s["phase"] == "Suspended" and s["restarts"] == 0
    assert "spent 1.03 of its 1 GPU-hours" in s["message"] and "Raise spec.budget.gpuHours" in s["message"]
    wait_for("the pods to stop", lambda: not gang(kube, namespace, "math"))
    wait_for("the metric service to stop", lambda: kube.get("deployment", "math-metric", namespace) is None)
    assert kube.get("pvc", "math-ckpt", namespace) is not None
    assert status(kube, namespace, "math")["checkpoint"]["path"] == CKPT
    assert wait_event(kube, namespace, "math", "BudgetExhausted")["type"] == "Warning"

    patch_budget(kube, namespace, "math", {"gpuHours": 2})
    wait_resumed_from(kube, namespace, "math", CKPT)
    wait_reasons(
        kube, namespace, "math", {"BudgetNearlySpent", "BudgetExhausted", "Resumed", "ResumedFromCheckpoint"}
    )


def test_the_forecast_is_in_the_status_from_apply_and_follows_the_measured_steps(
    kube: Cluster, namespace: str, operator: Operator
) -> None:
    run_job(kube, namespace, "fc")
    s = wait_status(kube, namespace, "fc", "the forecast from the spec", lambda s: "forecast" in s)
    forecast = s["forecast"]
    assert forecast["basis"] == "Spec" and "gpuHours" not in forecast
    assert forecast["gpus"] == forecast["trainingGpus"] + forecast["generationGpus"] > 0
    steps = forecast["steps"]

    # What trainer rank 0 writes after its fifth step: 0.1 GPU-hours spent, 0.02 a step, 5 steps run.
    report: dict[str, Any] = {
        "progress": {"step": 5, "totalSteps": steps},
        "cost": {"generationGpuSeconds": 200, "trainingGpuSeconds": 160, "steps": 5, "stepGpuSecondsStd": 3},
    }
    patch_job_status(kube, namespace, "fc", report)
    s = wait_status(
        kube,
        namespace,
        "fc",
        "the measured forecast",
        lambda s: s.get("forecast", {}).get("basis") == "Measured",
    )
    assert s["forecast"]["gpuHours"] == pytest.approx(0.02 * steps, rel=1e-2)
    assert s["forecast"]["gpuHoursLow"] < s["forecast"]["gpuHours"] < s["forecast"]["gpuHoursHigh"]
    assert s["forecast"]["fromSteps"] == 5 and steps > 5

    # The last step: the final figure, without a spread (removed from the stored status by the merge patch).
    report["progress"]["step"] = steps
    report["cost"].update({"steps": steps, "generationGpuSeconds": 400})
    patch_job_status(kube, namespace, "fc", report)
    s = wait_status(
        kube, namespace, "fc", "the final forecast", lambda s: s.get("forecast", {}).get("atStep") == steps
    )
    assert s["forecast"]["gpuHours"] == pytest.approx(560 / 3600, rel=1e-2)
    assert "gpuHoursLow" not in s["forecast"] and "gpuHoursHigh" not in s["forecast"]


PRICES = {"currency": "USD", "gpuHour": {"default": 3.0, "resources": {"nvidia.com/gpu": 2.5}}}


def scrape(operator: Operator, name: str) -> dict[str, float]:
    """The operator's /metrics samples of ``name``, by their labels as text."""
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.http_port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        str(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def test_the_platforms_namespace_budget_in_money_stops_a_job_that_names_none(
    kube: Cluster, namespace: str, tmp_path: Path
) -> None:
    settings = {
        "GRPO_OPERATOR_PRICES": json.dumps(PRICES),
        "GRPO_OPERATOR_NAMESPACE_BUDGETS": json.dumps({namespace: {"default": {"amount": 10}}}),
    }
    with running_operator(kube, namespace, tmp_path, env=settings) as operator:
        run_job(kube, namespace, "math")
        report_checkpoint(kube, namespace, "math", 5, CKPT)
        report_cost(kube, namespace, "math", 1800, 1800)  # 1 GPU-hour: 2.50 USD
        s = wait_status(kube, namespace, "math", "the spend", lambda s: "spend" in s)
        assert s["spend"]["currency"] == "USD" and s["spend"]["gpu"] == pytest.approx(2.5)
        assert s["spend"]["prices"] == "2.5 USD a GPU-hour (nvidia.com/gpu)"
        labels = str(sorted({"currency": "USD", "grpojob": "math", "namespace": namespace}.items()))
        spend = wait_for(
            "the spend on /metrics",
            lambda: scrape(operator, "grpo_operator_job_spend_total").get(labels),
            timeout=30,
        )
        assert spend == pytest.approx(2.5, abs=0.01)

        report_cost(kube, namespace, "math", 7200, 7200)  # 4 GPU-hours: 10 USD and some storage
        s = wait_status(
            kube,
            namespace,
            "math",
            "suspended by the default",
            lambda s: s.get("reason") == "BudgetExhausted",
        )
        assert (
            f"USD (the platform's default budget, Helm budgets.namespaces for namespace {namespace}"
            in (s["message"])
        )
        wait_for("the pods to stop", lambda: not gang(kube, namespace, "math"))
        assert status(kube, namespace, "math")["checkpoint"]["path"] == CKPT

        # The owner's own budget replaces the platform's default.
        patch_budget(kube, namespace, "math", {"amount": 50})
        wait_resumed_from(kube, namespace, "math", CKPT)


class BudgetCap:
    """A runner hook playing the job's owner and watching the cap work on a real trainer: once trainer rank 0
    has reported some spend, it sets spec.budget.gpuHours just above it, so that the next report crosses it;
    it records every report, and once the job is suspended with its trainer gone, raises the budget again."""

    def __init__(self, kube: Cluster, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace
        self.reports: list[tuple[int, float]] = []  # (status.progress.step, GPU-hours spent) as seen
        self.budget: float | None = None
        self.set_after: int | None = None  # the step whose report the budget was set from
        self.suspended: dict[str, Any] | None = None
        self.crossed_at: int | None = None  # the step of the first report at or over the budget

    def __call__(self, runner: LocalJobRunner) -> None:
        s = status(self.kube, self.namespace, "tiny")
        spent = spent_gpu_hours(s.get("cost"))
        step = (s.get("progress") or {}).get("step")
        if spent and isinstance(step, int) and (not self.reports or self.reports[-1] != (step, spent)):
            self.reports.append((step, spent))
            if self.budget is not None and self.crossed_at is None and spent >= self.budget:
                self.crossed_at = step
        if self.budget is None and spent and isinstance(step, int) and step >= 2:
            self.budget, self.set_after = spent * 1.001, step
            patch_budget(self.kube, self.namespace, "tiny", {"gpuHours": self.budget})
        stopped = s.get("reason") == "BudgetExhausted" and not runner.trainers and not runner.stopping
        if self.suspended is None and stopped and "checkpoint" in s:
            self.suspended = s
            patch_budget(self.kube, self.namespace, "tiny", {"gpuHours": 10})


@pytest.mark.trainer
def test_a_real_trainer_is_suspended_at_its_budget_with_a_checkpoint_and_resumes_to_the_end(
    kube: Cluster, namespace: str, tmp_path: Path
) -> None:
    """The cap with trainer rank 0 reporting for real (the tiny demo job, generation in the trainer's process):
    the operator suspends the job at the first report over the budget, the trainer writes a checkpoint at the
    step it was in, and a raised budget resumes it from there to Succeeded."""
    job = tiny_job()
    job["spec"]["grpo"]["steps"] = 30
    job["spec"]["checkpoints"]["everySteps"] = 100  # no periodic checkpoint: the suspension writes the one
    job["spec"]["budget"] = {"gpuHours": 10}
    cap = BudgetCap(kube, namespace)
    # Trainer rank 0 reports at most every 10 s, which is more than the whole tiny run: 1 s here, so the
    # reports are a step or two apart as they are on a GPU cluster, whose steps take longer than 10 s.
    # And a metric that takes over a second a step: the tiny model's own steps take 0.1-1 s depending on
    # what it writes, shorter than the hook, the operator and the runner (each polling about once a second)
    # take to react, and "within a step" needs a step that outlasts the reaction, as a GPU job's does.
    phase, volume = run_tiny_job(
        kube,
        namespace,
        job,
        tmp_path,
        "in-process-transformers",
        hooks=[cap],
        metric_commands={METRIC_IMAGE: [sys.executable, "tests/integration/slow_tiny_metric.py"]},
        status_interval_seconds=1,
    )
    assert phase == "Succeeded", (tmp_path / "run").glob("*.log")
    assert cap.budget is not None and cap.crossed_at is not None and cap.suspended is not None, cap.reports
    stopped = cap.suspended
    assert stopped["phase"] == "Suspended" and stopped["restarts"] == 0
    saved = stopped["checkpoint"]["lastStep"]
    # The trainer stops after the report over the budget, in the step it was in when the pod's deletion
    # reached it: the next one or two (steps of about a second; the runner, like a kubelet, takes about one).
    overshoot = (spent_gpu_hours(stopped["cost"]) or 0) - cap.budget
    print(
        f"budget {cap.budget * 3600:.1f} GPU-s set after step {cap.set_after}; crossed in the report of step "
        f"{cap.crossed_at}; checkpoint at step {saved}; overshoot {overshoot * 3600:.1f} GPU-s; reports "
        f"{[(s, round(h * 3600, 1)) for s, h in cap.reports]}"
    )
    assert cap.crossed_at <= saved <= cap.crossed_at + 2, (cap.crossed_at, saved, cap.reports)
    assert (volume / "checkpoints" / f"step-{saved}").is_dir()
    final = status(kube, namespace, "tiny")
    assert final["progress"]["step"] == 30 and final["trainerAttempt"] == 2 and final["restarts"] == 0
    events = {e["reason"]: e["message"] for e in events_of(kube, namespace, "tiny")}
    assert {"BudgetExhausted", "Resumed", "ResumedFromCheckpoint"} <= set(events), events
    assert f"step-{saved}" in events["ResumedFromCheckpoint"], events["ResumedFromCheckpoint"]
