"""What the tests of the operator running for real share: the operator fixture for one test, jobs' manifests,
waiting for statuses, conditions, phases and events, and playing the kubelet's and the trainer's part
(pod exits, checkpoints) by patching status, as tests/integration/test_operator.py describes."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.harness.kube import Cluster, wait_for
from tests.harness.operator_process import Operator
from tests.harness.readiness import generation_ready

CKPT = "/workspace/checkpoints/step-5"


@pytest.fixture
def operator(kube: Cluster, namespace: str, tmp_path: Path) -> Iterator[Operator]:
    with running_operator(kube, namespace, tmp_path) as op:
        yield op


@contextmanager
def running_operator(
    kube: Cluster, namespace: str, tmp_path: Path, env: dict[str, str] | None = None
) -> Iterator[Operator]:
    """The operator for one test in ``namespace``, with each generation pod reported Ready once started (no
    vLLM runs here; see tests/harness/readiness.py); on exit it stops and the namespace's jobs and their
    pods are deleted. ``env``: operator settings as GRPO_OPERATOR_<FIELD> variables, as the chart sets them."""
    op = Operator(kube, namespace, tmp_path / "operator.log", extra_env=env or {})
    op.start()
    try:
        with generation_ready(kube, namespace):
            yield op
    finally:
        op.stop()
        # Free the simulated GPUs before the next test: delete the jobs and wait for the garbage
        # collector to take their pods (the namespace itself is deleted without waiting).
        kube.kubectl(
            "delete", "grpojobs", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False
        )
        try:
            wait_for(
                "the jobs' pods to be gone",
                lambda: not pods(kube, namespace, roles=("trainer", "generation")),
                timeout=90,
            )
        finally:
            if os.environ.get("GRPO_SHOW_OPERATOR_LOG"):
                print(op.log_path.read_text(errors="replace"))


def job_manifest(name: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
        "dataset": {"train": "hf://openai/gsm8k:main#train"},
        "grpo": {"groupSize": 4, "promptsPerStep": 2, "steps": 10},
        "metric": {"image": "ghcr.io/grpo-operator/metric-math:0.1.0"},
        "generation": {"gpus": 1},
        "trainer": {"nodes": 2, "gpusPerNode": 2},
        "checkpoints": {"volume": {"accessMode": "ReadWriteMany", "size": "1Gi"}},
    }
    for key, value in spec.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "metadata": {"name": name}, "spec": base}


def get_job(kube: Cluster, namespace: str, name: str) -> dict[str, Any]:
    job = kube.get("grpojob", name, namespace)
    assert job is not None, f"GRPOJob {namespace}/{name} is gone"
    return job


def status(kube: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return dict(get_job(kube, namespace, name).get("status") or {})


def wait_status(
    kube: Cluster,
    namespace: str,
    name: str,
    what: str,
    predicate: Callable[[dict[str, Any]], bool],
    timeout: float = 90,
) -> dict[str, Any]:
    """Polls the job's status until ``predicate`` holds; returns that status."""
    found: list[dict[str, Any]] = []

    def check() -> bool:
        current = status(kube, namespace, name)
        if predicate(current):
            found.append(current)
            return True
        return False

    wait_for(f"{name}: {what}", check, timeout=timeout)
    return found[-1]


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})


def wait_condition(
    kube: Cluster,
    namespace: str,
    name: str,
    type_: str,
    *,
    status: str | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    """Polls until the job's condition ``type_`` has the given status and/or reason; returns the status."""

    def matches(s: dict[str, Any]) -> bool:
        cond = _condition(s, type_)
        return bool(cond) and status in (None, cond.get("status")) and reason in (None, cond.get("reason"))

    return wait_status(kube, namespace, name, f"condition {type_} {status or ''}/{reason or ''}", matches)


def wait_phase(kube: Cluster, namespace: str, name: str, phase: str, timeout: float = 90) -> dict[str, Any]:
    return wait_status(kube, namespace, name, f"phase {phase}", lambda s: s.get("phase") == phase, timeout)


def pods(
    kube: Cluster, namespace: str, job: str | None = None, roles: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    selector = f"grpo.dev/job={job}" if job else "grpo.dev/job"
    out = json.loads(kube.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout)[
        "items"
    ]
    return [p for p in out if not roles or p["metadata"]["labels"].get("grpo.dev/role") in roles]


def gang(kube: Cluster, namespace: str, job: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in pods(kube, namespace, job, ("trainer", "generation"))}


def no_gang_pods(kube: Cluster, namespace: str, job: str) -> bool:
    return not pods(kube, namespace, job, ("trainer", "generation"))


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env", [])}


def patch_pod_status(kube: Cluster, namespace: str, name: str, patch: dict[str, Any]) -> None:
    kube.kubectl(
        "patch", "pod", name, "-n", namespace, "--subresource=status", "--type=merge", "-p", json.dumps(patch)
    )


def terminate_pod(kube: Cluster, namespace: str, name: str, exit_code: int, message: str = "") -> None:
    """What the kubelet reports when the container exits (restartPolicy Never)."""
    kube.terminate_pod(namespace, name, exit_code, message)


def patch_job_status(kube: Cluster, namespace: str, name: str, status: dict[str, Any]) -> None:
    """Write ``status`` into the job's as trainer rank 0 does (status subresource, merge patch)."""
    kube.kubectl(
        "patch",
        "grpojob",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )


def report_checkpoint(kube: Cluster, namespace: str, name: str, step: int, path: str) -> None:
    """What trainer rank 0 writes after a verified checkpoint."""
    patch_job_status(
        kube,
        namespace,
        name,
        {"checkpoint": {"lastStep": step, "path": path, "time": "2026-11-29T08:00:00Z"}},
    )


def wait_resumed_from(kube: Cluster, namespace: str, name: str, checkpoint: str) -> None:
    """A suspended job resumed: Running again with gang attempt 2, no restart counted, its trainers told to
    resume from ``checkpoint``."""
    s = wait_phase(kube, namespace, name, "Running")
    assert s["trainerAttempt"] == 2 and s["restarts"] == 0, s
    for pod_name, pod in gang(kube, namespace, name).items():
        assert pod_name.startswith((f"{name}-gen-2-", f"{name}-trainer-2-")), pod_name
        if "trainer" in pod_name:
            assert env_of(pod)["RESUME_FROM"] == checkpoint


def events_of(kube: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    out = kube.kubectl(
        "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}", "-o", "json"
    ).stdout
    return list(json.loads(out)["items"])


def wait_event(kube: Cluster, namespace: str, name: str, reason: str) -> dict[str, Any]:
    """The first event with ``reason`` on the job (events follow the status patch by a moment)."""
    found: list[dict[str, Any]] = []

    def check() -> bool:
        found[:] = [e for e in events_of(kube, namespace, name) if e["reason"] == reason]
        return bool(found)

    wait_for(f"a {reason} event on {name}", check, timeout=30)
    return found[0]


def wait_reasons(kube: Cluster, namespace: str, name: str, expected: set[str]) -> None:
    wait_for(
        f"events {sorted(expected)} on {name}",
        lambda: expected <= {e["reason"] for e in events_of(kube, namespace, name)},
        timeout=30,
    )


def run_job(kube: Cluster, namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    kube.apply(job_manifest(name, **spec), namespace)
    return wait_phase(kube, namespace, name, "Running")


# --- tests ------------------------------------------------------------------------------------------------------
