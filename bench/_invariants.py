"""What must hold after any chaos: the checks every bench/chaos.py scenario ends with.

1. Exactly one set of children per job: the objects labelled grpo.dev/job=<job> are, kind by kind and
   name by name, what the operator's builders say the job needs at its current attempt — nothing
   missing, nothing twice, no pod of an earlier attempt still alive.
2. No orphaned objects: every labelled object belongs (owner reference, by UID) to a GRPOJob that
   exists; a metric pod to a ReplicaSet that does. A checkpoint PVC with retention Retain is unowned by
   design and only has to name an existing job.
3. No job stuck: every job is in the phase its scenario expects (Running, Pending/Unschedulable for
   jobs that cannot fit, Failed/BackoffLimitExceeded where the budget was spent), and a Running job's
   status says its metric service is up (condition MetricReady True) while its metric pods run.
4. No checkpoint reference lost: status.checkpoint is what trainer rank 0 last reported, and every
   trainer pod of a later attempt resumes from it (RESUME_FROM).
5. Restart counts right: status.restarts is the number of counted failures the scenario caused
   (capped by backoffLimit), status.trainerAttempt is 1 + every restart, counted or not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from _bench import LABEL_ATTEMPT, LABEL_JOB, LABEL_ROLE, BenchCluster, Obj
from grpo_operator.builders.child_kinds import CHILD_KINDS as CHILD_KIND_RECORDS

# Every kind the operator creates, as kubectl names them, with their Kind (one record each).
CHILD_KINDS = {k.kubectl_name: k.kind for k in CHILD_KIND_RECORDS}


@dataclass
class Expect:
    """What a scenario expects of one job when the dust has settled."""

    phase: str = "Running"
    reason: str | None = None
    restarts: int = 0  # counted restarts
    uncounted: int = 0  # restarts that do not spend the budget (node loss, spec change)
    checkpoint: dict[str, Any] | None = None  # status.checkpoint as last reported
    # At least this many uncounted restarts (node loss: the exact count depends on timing only when a
    # second disruption hits the same job; the scenarios make that impossible, so min == exact).
    attempt_at_least: bool = False


@dataclass
class Report:
    violations: list[str] = field(default_factory=list)
    checked_jobs: int = 0
    checked_objects: int = 0

    def fail(self, message: str) -> None:
        self.violations.append(message)

    def print(self, title: str) -> bool:
        ok = not self.violations
        verdict = "PASS" if ok else f"FAIL ({len(self.violations)} violations)"
        print(f"{title}: invariants over {self.checked_jobs} jobs, {self.checked_objects} objects: {verdict}")
        for line in self.violations[:40]:
            print(f"  - {line}")
        if len(self.violations) > 40:
            print(f"  ... and {len(self.violations) - 40} more")
        return ok


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), None)


def metric_ready(status: dict[str, Any]) -> bool:
    """The job's status says its metric service has a ready pod."""
    return ((_condition(status, "MetricReady") or {}).get("status")) == "True"


def _live(obj: Obj) -> bool:
    return not (obj.get("metadata") or {}).get("deletionTimestamp")


def _env(pod: Obj) -> dict[str, str]:
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return {e["name"]: e.get("value", "") for e in containers[0].get("env") or []}


def check(cluster: BenchCluster, namespaces: list[str], expect: dict[tuple[str, str], Expect]) -> Report:
    """Checks the five invariants over every job in ``namespaces``; ``expect`` says what each job's end
    state must be (jobs missing from it are expected Running with no restart)."""
    from grpo_operator.builders import gang_pods, infrastructure, job_from_object, metric_workload
    from grpo_operator.settings import OperatorSettings

    settings = OperatorSettings()
    report = Report()
    jobs: dict[tuple[str, str], Obj] = {}
    children: dict[tuple[str, str], list[Obj]] = {}
    replicasets: dict[tuple[str, str], Obj] = {}
    for namespace in namespaces:
        for job in cluster.get_list("grpojobs", namespace):
            jobs[(namespace, job["metadata"]["name"])] = job
        for plural, kind in CHILD_KINDS.items():
            for obj in cluster.get_list(plural, namespace, LABEL_JOB):
                obj["kind"] = kind
                job_name = obj["metadata"]["labels"][LABEL_JOB]
                children.setdefault((namespace, job_name), []).append(obj)
                report.checked_objects += 1
        for rs in cluster.get_list("replicasets", namespace):
            replicasets[(namespace, rs["metadata"]["name"])] = rs

    for key in expect:
        if key not in jobs:
            report.fail(f"{key[0]}/{key[1]}: the GRPOJob is gone")

    for key, job in sorted(jobs.items()):
        report.checked_jobs += 1
        where = f"{key[0]}/{key[1]}"
        want = expect.get(key, Expect())
        status = job.get("status") or {}
        uid = job["metadata"]["uid"]

        # 3. not stuck: the expected phase (and reason where given)
        if status.get("phase") != want.phase or (want.reason and status.get("reason") != want.reason):
            report.fail(
                f"{where}: phase {status.get('phase')}/{status.get('reason')}, expected {want.phase}"
                f"{'/' + want.reason if want.reason else ''} ({status.get('message', '')[:200]})"
            )

        # 5. restart counts
        restarts = int(status.get("restarts") or 0)
        attempt = int(status.get("trainerAttempt") or 0)
        if restarts != want.restarts:
            report.fail(f"{where}: status.restarts is {restarts}, expected {want.restarts}")
        expected_attempt = 1 + want.restarts + want.uncounted
        if (attempt < expected_attempt) if want.attempt_at_least else (attempt != expected_attempt):
            report.fail(f"{where}: status.trainerAttempt is {attempt}, expected {expected_attempt}")

        # 4. checkpoint reference
        if want.checkpoint is not None and status.get("checkpoint") != want.checkpoint:
            report.fail(
                f"{where}: status.checkpoint is {status.get('checkpoint')}, expected {want.checkpoint}"
            )

        # 1. exactly one set of children
        objs = [o for o in children.get(key, []) if _live(o)]
        have: dict[str, list[str]] = {}
        for obj in objs:
            if obj["kind"] == "Pod" and (obj["metadata"].get("labels") or {}).get(LABEL_ROLE) == "metric":
                continue  # made by the Deployment's ReplicaSet, checked below
            have.setdefault(obj["kind"], []).append(obj["metadata"]["name"])
        spec_job = job_from_object(job)
        desired = [*infrastructure(spec_job, settings)]
        terminal = status.get("phase") in ("Succeeded", "Failed")
        if not terminal:
            desired += metric_workload(spec_job, settings)
            desired += gang_pods(spec_job, settings, attempt, "")
        wanted: dict[str, list[str]] = {}
        for manifest in desired:
            wanted.setdefault(manifest["kind"], []).append(manifest["metadata"]["name"])
        for kind in sorted(set(have) | set(wanted)):
            got, need = sorted(have.get(kind, [])), sorted(wanted.get(kind, []))
            if kind == "Pod" and terminal:
                continue  # a finished job keeps its terminated trainer pods for their logs
            if got != need:
                report.fail(f"{where}: {kind} objects {got}, expected exactly {need}")
        pods = [o for o in objs if o["kind"] == "Pod" and o["metadata"]["labels"].get(LABEL_ROLE) != "metric"]
        for pod in pods:
            if pod["metadata"]["labels"].get(LABEL_ATTEMPT) != str(attempt) and not terminal:
                report.fail(f"{where}: pod {pod['metadata']['name']} of another attempt is still alive")
            if want.phase == "Running" and (pod.get("status") or {}).get("phase") != "Running":
                report.fail(
                    f"{where}: pod {pod['metadata']['name']} is {(pod.get('status') or {}).get('phase')}"
                )
            # 4. every trainer of a later attempt resumes from the reported checkpoint
            if (
                pod["metadata"]["labels"].get(LABEL_ROLE) == "trainer"
                and attempt > 1
                and want.checkpoint is not None
                and _env(pod).get("RESUME_FROM") != want.checkpoint.get("path")
            ):
                report.fail(
                    f"{where}: pod {pod['metadata']['name']} resumes from {_env(pod).get('RESUME_FROM')!r}, "
                    f"expected {want.checkpoint.get('path')!r}"
                )
        if want.phase == "Running":
            metric_pods = [
                o
                for o in objs
                if o["kind"] == "Pod"
                and o["metadata"]["labels"].get(LABEL_ROLE) == "metric"
                and (o.get("status") or {}).get("phase") == "Running"
            ]
            replicas = int(spec_job.spec.metric.replicas) if spec_job.spec.metric is not None else 0
            if len(metric_pods) != replicas:
                report.fail(f"{where}: {len(metric_pods)} metric pods Running, expected {replicas}")
            if not metric_ready(status):
                report.fail(
                    f"{where}: condition MetricReady is not True: {_condition(status, 'MetricReady')}"
                )

        # 2. owned by this job (by UID)
        for obj in children.get(key, []):
            meta = obj["metadata"]
            refs = meta.get("ownerReferences") or []
            name = f"{obj['kind']} {meta['name']}"
            if obj["kind"] == "Pod" and meta.get("labels", {}).get(LABEL_ROLE) == "metric":
                owners = [(key[0], r["name"]) for r in refs if r.get("kind") == "ReplicaSet"]
                if not owners or owners[0] not in replicasets:
                    report.fail(f"{where}: metric pod {meta['name']} has no live ReplicaSet")
                continue
            if (
                obj["kind"] == "PersistentVolumeClaim"
                and (meta.get("annotations") or {}).get("grpo.dev/retention") == "Retain"
            ):
                continue
            if not any(r.get("uid") == uid for r in refs):
                report.fail(
                    f"{where}: {name} is not owned by the job (owners {[r.get('uid') for r in refs]})"
                )

    # 2. children of jobs that do not exist
    for key, objs in sorted(children.items()):
        if key in jobs:
            continue
        for obj in objs:
            retained = obj["kind"] == "PersistentVolumeClaim" and (
                (obj["metadata"].get("annotations") or {}).get("grpo.dev/retention") == "Retain"
            )
            if _live(obj) and not retained:
                report.fail(
                    f"orphan: {obj['kind']} {key[0]}/{obj['metadata']['name']} of missing job {key[1]}"
                )
    return report
