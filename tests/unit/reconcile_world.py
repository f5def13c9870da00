"""The in-memory cluster of the reconcile tests: the job object and its children as plain data, each plan
applied to them the way the API server would (tests/unit/test_reconcile*.py and the other reconcile tests)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from grpo_operator.reconcile import Observed, Plan, reconcile
from grpo_operator.reconcile.conditions import format_time
from grpo_operator.reconcile.record import ANNOTATION_RECORD, read_record, record_annotation
from grpo_operator.settings import OperatorSettings

T0 = datetime(2026, 11, 29, 8, 0, 0, tzinfo=UTC)
SETTINGS = OperatorSettings()
CKPT = "/workspace/checkpoints/step-50"


def job_object(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"name": "Qwen/Qwen2.5-1.5B-Instruct"},
        "dataset": {"train": "hf://openai/gsm8k:main#train"},
        "grpo": {"groupSize": 8, "promptsPerStep": 4, "steps": 500},
        "metric": {"image": "ghcr.io/grpo-operator/metric-math:0.1.0"},
        "trainer": {"nodes": 2, "gpusPerNode": 2},
        "checkpoints": {"volume": {"accessMode": "ReadWriteMany"}},
        "runPolicy": {"backoffLimit": 2},
    }
    for key, value in spec.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return {
        "apiVersion": "grpo.dev/v1alpha1",
        "kind": "GRPOJob",
        "metadata": {"name": "math", "namespace": "ns", "uid": "uid-1", "generation": 1},
        "spec": base,
    }


@dataclass
class World:
    """The job and its children as the API server would hold them."""

    job: dict[str, Any]
    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    now: datetime = T0
    nodes: frozenset[str] | None = frozenset({"gpu-node-0", "gpu-node-1", "cpu-node-0"})
    plans: list[Plan] = field(default_factory=list)
    serial: int = 0
    # Secrets the operator created, by name: never observed (the operator does not list, watch or read them).
    secrets: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Deleted pods stay, terminating, until gone() (a real kubelet's grace period); else they vanish at once.
    graceful: bool = False
    settings: OperatorSettings = SETTINGS

    def observed(self) -> Observed:
        return Observed(objects=tuple(copy.deepcopy(list(self.objects.values()))), nodes=self.nodes)

    def reconcile(self) -> Plan:
        plan = reconcile(copy.deepcopy(self.job), self.observed(), self.now, self.settings)
        self.plans.append(plan)
        return plan

    def apply(
        self, plan: Plan, *, status: bool = True, deletes: bool = True, creates: int | None = None
    ) -> None:
        """Carry out a plan like the runtime does (optionally only part of it, as a killed operator would),
        with the API server's preconditions: a write naming a uid reaches only the object with that uid,
        and a create never replaces an existing object. Secrets first, under a generateName: the names the
        API server picks join the record and the status, as the runtime writes them."""
        recorded: dict[str, str] = {}
        for secret in plan.secrets:
            meta = secret.manifest["metadata"]
            assert "name" not in meta, "a generated Secret is created under a generateName only"
            generated = f"{meta['generateName']}x{self.serial + 1:04d}"
            created = self._created({**secret.manifest, "metadata": {**meta, "name": generated}})
            created["stringData"] = {secret.key: f"generated-{self.serial}"}
            self.secrets[generated] = created
            recorded[secret.status_field] = generated
        record, new_status = plan.record, plan.status
        if recorded:
            record = {**(record if record is not None else read_record(self.job) or {}), **recorded}
            new_status = {**(new_status or {}), **recorded}
        if status and record is not None:
            annotations = self.job["metadata"].setdefault("annotations", {})
            annotations[ANNOTATION_RECORD] = record_annotation(record)
        if status and new_status:
            current = self.job.setdefault("status", {})
            for key, value in new_status.items():
                if value is None:
                    current.pop(key, None)
                else:
                    current[key] = copy.deepcopy(value)
        for child_patch in plan.patches:
            target = self.objects.get((child_patch.ref.kind, child_patch.ref.name))
            if target is not None and self._same(target, child_patch.ref.uid):
                annotations = child_patch.patch.get("metadata", {}).get("annotations", {})
                target["metadata"].setdefault("annotations", {}).update(annotations)
        if deletes:
            for ref in plan.deletes:
                target = self.objects.get((ref.kind, ref.name))
                if target is not None and self._same(target, ref.uid):
                    if self.graceful and ref.kind == "Pod":
                        # A kubelet keeps the pod for its termination grace period.
                        target["metadata"]["deletionTimestamp"] = format_time(self.now)
                    else:
                        del self.objects[(ref.kind, ref.name)]
        for manifest in plan.applies:
            name = (manifest["kind"], manifest["metadata"]["name"])
            uid = manifest["metadata"].get("uid")
            existing = self.objects.get(name)
            if uid is None and existing is None:
                self.objects[name] = self._created(manifest)
            elif uid is not None and existing is not None and self._same(existing, uid):
                self.objects[name] = copy.deepcopy(manifest)
        for manifest in plan.creates[: creates if creates is not None else len(plan.creates)]:
            obj = self._created(manifest)
            obj["status"] = {"phase": "Pending"}
            self.objects.setdefault((obj["kind"], obj["metadata"]["name"]), obj)

    def _created(self, manifest: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(manifest)
        self.serial += 1
        obj["metadata"]["uid"] = f"uid-{obj['metadata']['name']}-{self.serial}"
        obj["metadata"]["creationTimestamp"] = format_time(self.now)
        return obj

    @staticmethod
    def _same(obj: dict[str, Any], uid: str | None) -> bool:
        assert uid is not None, f"a write to {obj['metadata']['name']} without a uid precondition"
        return bool(obj["metadata"].get("uid") == uid)

    def step(self) -> Plan:
        plan = self.reconcile()
        self.apply(plan)
        return plan

    def settle(self) -> Plan:
        """Reconcile and apply until nothing changes; returns the last (empty) plan."""
        for _ in range(10):
            plan = self.step()
            if plan.is_empty():
                return plan
        raise AssertionError(f"reconcile did not converge: {self.plans[-1]}")

    # --- pod lifecycles, the way kube-scheduler and kwok would move them ----------------------------------

    def pods(self, role: str | None = None) -> list[dict[str, Any]]:
        return [
            o
            for (kind, _), o in sorted(self.objects.items())
            if kind == "Pod" and (role is None or o["metadata"]["labels"]["grpo.dev/role"] == role)
        ]

    def pod(self, name: str) -> dict[str, Any]:
        return self.objects[("Pod", name)]

    def schedule_all(self) -> None:
        for i, pod in enumerate(self.pods()):
            pod["spec"]["nodeName"] = f"gpu-node-{i % 2}"
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]

    def run_all(self) -> None:
        """Every pod running and Ready (vLLM answers /health), as the kubelet reports it."""
        self.schedule_all()
        for pod in self.pods():
            pod["status"]["phase"] = "Running"
            pod["status"]["startTime"] = format_time(self.now)
            pod["status"]["conditions"].append(
                {"type": "Ready", "status": "True", "lastTransitionTime": format_time(self.now)}
            )

    def terminate(
        self, name: str, exit_code: int, message: str = "", phase: str | None = None, reason: str = "Error"
    ) -> None:
        pod = self.pod(name)
        pod["status"]["phase"] = phase or ("Succeeded" if exit_code == 0 else "Failed")
        pod["status"]["containerStatuses"] = [
            {
                "name": pod["spec"]["containers"][0]["name"],
                "state": {"terminated": {"exitCode": exit_code, "reason": reason, "message": message}},
            }
        ]

    def gone(self) -> None:
        """Every terminating pod finishes its grace period and leaves the API."""
        for key in [k for k, o in self.objects.items() if o["metadata"].get("deletionTimestamp")]:
            del self.objects[key]

    def status(self) -> dict[str, Any]:
        return dict(self.job.get("status") or {})

    def condition(self, type_: str) -> dict[str, Any]:
        return next(c for c in self.status()["conditions"] if c["type"] == type_)

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def running_world(**spec: Any) -> World:
    world = World(job_object(**spec))
    world.settle()
    world.run_all()
    world.settle()
    assert world.status()["phase"] == "Running"
    return world


def env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


def events(plan: Plan) -> list[tuple[str, str]]:
    return [(e.type, e.reason) for e in plan.events]


def assert_second_gang_resumes_from_checkpoint(plan: Plan) -> None:
    """The plan creates the whole second gang, and its trainers resume from CKPT."""
    assert sorted(m["metadata"]["name"] for m in plan.creates) == [
        "math-gen-2-0",
        "math-trainer-2-0",
        "math-trainer-2-1",
    ]
    assert all(env(p)["RESUME_FROM"] == CKPT for p in plan.creates if "trainer" in p["metadata"]["name"])


# --- creation and steady state ---------------------------------------------------------------------------


def foreign(kind: str, name: str, **metadata: Any) -> dict[str, Any]:
    """An object someone else created in the job's namespace (no controller reference to the job)."""
    meta = {"name": name, "namespace": "ns", "uid": f"theirs-{name}", **metadata}
    return {"apiVersion": "v1", "kind": kind, "metadata": meta, "data": {"keep": "me"}}


def applied_names(plan: Plan) -> set[tuple[str, str]]:
    return {(m["kind"], m["metadata"]["name"]) for m in plan.applies}
