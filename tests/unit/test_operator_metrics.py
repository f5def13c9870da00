"""The operator's job metrics as Prometheus reads them: counts by phase, and one series per job."""

from __future__ import annotations

from grpo_operator.observability import OperatorMetrics
from prometheus_client.parser import text_string_to_metric_families


def samples(metrics: OperatorMetrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_one_series_per_job_with_its_current_phase_and_none_once_it_is_gone() -> None:
    phases: dict[tuple[str, str], str | None] = {
        ("team-a", "math"): "Running",
        ("team-a", "huge"): "Pending",
        ("team-b", "code"): None,  # just seen, not reconciled yet: reported as Pending
    }
    metrics = OperatorMetrics(lambda: phases)
    per_job = samples(metrics, "grpo_operator_job_phase")
    assert per_job == {
        (("grpojob", "math"), ("namespace", "team-a"), ("phase", "Running")): 1.0,
        (("grpojob", "huge"), ("namespace", "team-a"), ("phase", "Pending")): 1.0,
        (("grpojob", "code"), ("namespace", "team-b"), ("phase", "Pending")): 1.0,
    }
    counts = samples(metrics, "grpo_operator_jobs")
    assert counts[(("phase", "Pending"),)] == 2 and counts[(("phase", "Running"),)] == 1
    assert counts[(("phase", "Failed"),)] == 0  # every phase is present, 0 when empty

    phases[("team-a", "math")] = "Failed"
    del phases[("team-a", "huge")]
    per_job = samples(metrics, "grpo_operator_job_phase")
    assert (("grpojob", "math"), ("namespace", "team-a"), ("phase", "Failed")) in per_job
    assert not any(dict(k)["grpojob"] == "huge" for k in per_job)
    assert not any(dict(k)["phase"] == "Running" for k in per_job)
