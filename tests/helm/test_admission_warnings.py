"""The chart's warnings policy against the real API server: `kubectl apply` of a job with an unpinned image,
a model name that is a URL or a run above admissionPolicies.warnings.warnAboveRollouts prints a Kubernetes
warning and still creates the job, and the words are those of `kubectl grpo check`
(grpo_operator.api.advice), case by case (tests/unit/advice_cases.py)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from grpo_operator.api import GRPOJob
from grpo_operator.api.advice import warnings

from tests.harness.kube import Cluster, wait_for
from tests.helm.chart import run, template_args
from tests.unit.advice_cases import WARNING_CASES
from tests.unit.manifests import with_changes

pytestmark = pytest.mark.slow

THRESHOLD = 10_000_000


@pytest.fixture(scope="module")
def watched(kube: Cluster) -> Iterator[str]:
    namespace = kube.new_namespace("warn")
    release = f"w{uuid.uuid4().hex[:6]}"
    sets = {
        "watch.allNamespaces": "false",
        "watch.namespaces[0]": namespace,
        "admissionPolicies.warnings.warnAboveRollouts": str(THRESHOLD),
    }
    args = template_args(sets=sets, release=release, namespace=namespace)
    rendered = run([*args, "--show-only", "templates/admission-warnings.yaml"]).stdout
    kube.kubectl("apply", "-f", "-", input=rendered)
    try:
        # The API server picks the policy and its binding up from its informers.
        probe = with_changes({"spec.metric.image": "metric:latest"}, name="probe")
        wait_for(
            "the warnings policy to be in force",
            lambda: "Warning: " in apply(kube, probe, namespace, dry_run=True).stderr,
            timeout=60,
        )
        yield namespace
    finally:
        kube.kubectl("delete", "-f", "-", "--wait=false", input=rendered, check=False)
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def apply(kube: Cluster, job: dict[str, Any], namespace: str, *, dry_run: bool) -> Any:
    args = ["apply", "-n", namespace, "-f", "-"] + (["--dry-run=server"] if dry_run else [])
    return kube.kubectl(*args, input=yaml.safe_dump(job), check=False)


def shown_warnings(stderr: str) -> list[str]:
    """The warnings kubectl printed, without the prefix the API server puts before each policy message."""
    found = []
    for line in stderr.splitlines():
        if line.startswith("Warning: "):
            match = re.match(
                r"Warning: Validation failed for ValidatingAdmissionPolicy '[-\w]+-grpo-operator-warnings'"
                r" with binding '[-\w]+': (.*)$",
                line,
            )
            assert match, f"a warning from something else than the chart's policy: {line}"
            found.append(match.group(1))
    return found


@pytest.mark.parametrize(("case_id", "changes", "fields"), WARNING_CASES, ids=[c[0] for c in WARNING_CASES])
def test_kubectl_apply_warns_in_the_words_of_kubectl_grpo_check(
    kube: Cluster, watched: str, case_id: str, changes: dict[str, Any], fields: list[str]
) -> None:
    job = with_changes(changes, name=f"w-{case_id}")
    proc = apply(kube, job, watched, dry_run=True)
    assert proc.returncode == 0, proc.stderr  # a warning never refuses
    expected = [w.message for w in warnings(GRPOJob.model_validate(job).spec, THRESHOLD)]
    assert len(expected) == len(fields)
    assert sorted(shown_warnings(proc.stderr)) == sorted(expected), proc.stderr


def test_a_warned_job_is_created(kube: Cluster, watched: str) -> None:
    job = with_changes(
        {"spec.model.name": "https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct"}, name="created"
    )
    proc = apply(kube, job, watched, dry_run=False)
    assert proc.returncode == 0 and "give the Hub id 'Qwen/Qwen2.5-0.5B-Instruct'" in proc.stderr, proc.stderr
    assert kube.get("grpojob", "created", watched) is not None


def test_the_warnings_can_be_turned_off() -> None:
    args = template_args(sets={"admissionPolicies.warnings.enabled": "false"})
    shown = run([*args, "--show-only", "templates/admission-warnings.yaml"], check=False)
    assert shown.returncode != 0 and "could not find template" in shown.stderr
