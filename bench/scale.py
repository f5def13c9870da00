"""How the operator's cost grows with the number of GRPOJobs, against the floor of raw object creation.

    .venv/bin/python bench/scale.py                      # 30, 100 and 300 jobs on cluster grpo-scale
    .venv/bin/python bench/scale.py --jobs 30 --idle 30  # one quick size
    .venv/bin/python bench/scale.py --json out.json      # also write the figures as JSON

Starts (or reuses) a local cluster of its own (hack/cluster.sh, name ``grpo-scale``: 100 simulated
8-GPU nodes + 4 CPU nodes for the metric pods). For each size N, on an otherwise idle cluster:

(a) the floor: ``kubectl create -f`` of exactly the child objects the operator would create for the
    N jobs (rendered by the operator's own builders, no GRPOJob behind them), timed until every gang
    pod of every schedulable job is Running — the same end state (b) waits for, reached with no
    operator at all. The time for ``kubectl create`` alone is printed too.
(b) a fresh operator, then ``kubectl apply --server-side`` of the N GRPOJobs, timed until every
    schedulable job is phase Running and every job that cannot fit is Pending with reason
    Unschedulable; per job, time from the job's appearance to its Running.

With ``--kueue`` the same run goes through Kueue (hack/cluster.sh starts its manager): every job gets
``spec.scheduling.queueName``, all jobs share one ClusterQueue whose GPU quota is the cluster's GPUs,
and the report adds the time from a job's appearance to Kueue's admission (every gang pod's scheduling
gate lifted). The floor is skipped then (it does not go through a queue). Deleted pods are stopped by
the benchmark, as the kubelet would: kwok leaves a pod that Kueue's finalizer holds running.

Then, with nothing changing, the operator's requests over ``--idle`` seconds. Requests are counted by
the API server: the operator runs as its own ServiceAccount whose requests form one API Priority and
Fairness flow (bench/_bench.py explains why not apiserver_request_total, which is printed for all
clients for context). CPU seconds and peak RSS are read from /proc for the operator process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _bench import (
    LABEL_JOB,
    BenchCluster,
    Obj,
    OperatorProcess,
    Ramp,
    RequestCounts,
    bench_jobs,
    children_of,
    create_namespaces,
    delete_namespaces,
    gang_size,
    gpu_pods,
    job_informer,
    log,
    machine_cpu,
    median,
    operator_identity,
    percentile,
    pod_informer,
    schedulable,
    settle,
    wait_for,
    write_list,
)
from grpo_operator.builders.child_kinds import CHILD_KINDS as CHILD_KIND_RECORDS
from grpo_operator.builders.common import LABEL_ROLE

NAMESPACES_PER_RUN = 5


@dataclass
class SizeResult:
    jobs: int
    schedulable_jobs: int
    child_objects: int
    floor_create_s: float
    floor_running_s: float
    operator_running_s: float
    apply_s: float
    ratio: float
    ratio_to_create: float
    p50_s: float
    p95_s: float
    max_s: float
    operator_requests: float
    operator_requests_per_job: float
    all_requests_per_job: float
    floor_requests_per_job: float
    idle_seconds: float
    idle_operator_requests_per_min: float
    operator_cpu_s: float
    operator_cpu_s_per_job: float
    idle_operator_cpu_s_per_min: float
    operator_peak_rss_mib: float
    machine_busy_fraction: float
    load_avg_start: float
    load_avg_end: float
    reconcile_total: float
    # reconciles from the apply until every job settled (the operator's own counter), per job; without
    # those of jobs already gone (the floor's children, deleted meanwhile, each wake their job's key)
    ramp_reconciles_per_job: float
    # stage -> (p50, p95) seconds since the job was applied, and (p50, p95) of the stage alone
    timeline: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)
    # the operator's own request counter, "verb resource" -> requests per job (ramp) / in the idle window
    ramp_requests_per_job_by_kind: dict[str, float] = field(default_factory=dict)
    idle_requests_by_kind: dict[str, float] = field(default_factory=dict)
    # after every job is Running: requests per job until the operator went quiet, and how long that took
    settling_requests_per_job_by_kind: dict[str, float] = field(default_factory=dict)
    quiet_after_s: float = float("nan")
    # the operator's Events until every job settled, "type reason" -> events per job
    events_per_job_by_reason: dict[str, float] = field(default_factory=dict)
    kueue: bool = False
    admitted_p50_s: float = float("nan")
    admitted_p95_s: float = float("nan")


KUEUE_QUEUE = "bench-queue"


def kueue_setup(cluster: BenchCluster, gpus: int) -> None:
    """Kueue's manager in the bench cluster, a ResourceFlavor and one ClusterQueue holding every GPU."""
    env = {**os.environ, "GRPO_CLUSTER_NAME": cluster.name}
    out = subprocess.run(
        ["bash", str(Path(__file__).resolve().parents[1] / "hack" / "cluster.sh"), "kueue"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"hack/cluster.sh kueue failed:\n{out.stderr[-4000:]}")
    flavor = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "bench"}}
    quota = [
        {"name": "cpu", "nominalQuota": 100000},
        {"name": "memory", "nominalQuota": "1000Ti"},
        {"name": "nvidia.com/gpu", "nominalQuota": gpus},
    ]
    queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": "bench"},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                    "flavors": [{"name": "bench", "resources": quota}],
                }
            ],
        },
    }
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [flavor, queue]})
    )


def kueue_namespaces(cluster: BenchCluster, namespaces: list[str]) -> None:
    items: list[Obj] = []
    for ns in namespaces:
        items.append(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": ns, "labels": {"kueue-managed": "true"}},
            }
        )
        items.append(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": KUEUE_QUEUE, "namespace": ns},
                "spec": {"clusterQueue": "bench"},
            }
        )
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    )


def queued(manifest: Obj) -> Obj:
    spec = manifest["spec"]
    spec["scheduling"] = {**spec.get("scheduling", {}), "queueName": KUEUE_QUEUE}
    return manifest


def stop_deleted_pods(cluster: BenchCluster) -> None:
    """What the kubelet does and kwok does not when a finalizer other than kwok's holds a deleted pod."""
    for pod in cluster.get_list("pods", selector=LABEL_JOB):
        meta, phase = pod["metadata"], (pod.get("status") or {}).get("phase")
        if meta.get("deletionTimestamp") and meta.get("finalizers") and phase not in ("Succeeded", "Failed"):
            cluster.kubectl(
                "patch", "pod", meta["name"], "-n", meta["namespace"], "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": {"phase": "Failed"}}), check=False,
            )  # fmt: skip


# The way of one schedulable job to Running, from the API server's own records (second resolution: every
# timestamp below is a metav1.Time). Each stage is the moment the last object of that stage got there.
STAGES: tuple[tuple[str, str], ...] = (
    ("applied", "the GRPOJob's creationTimestamp"),
    ("first reconcile", "status.startTime: when the first reconcile decided to start the job"),
    ("first child created", "the earliest creationTimestamp of the job's children"),
    ("infrastructure created", "the last non-pod child's creationTimestamp"),
    ("gang pods created", "the last vLLM/trainer pod's creationTimestamp"),
    ("volume provisioned", "the checkpoint claim's PersistentVolume's creationTimestamp (side stage)"),
    ("claim bound", "the PV controller's last write of the claim, from its managedFields (side stage)"),
    ("gang pods bound", "the last gang pod's PodScheduled condition"),
    ("gang pods Running", "the last gang pod's Ready condition (vLLM must answer /health)"),
    ("status Running", "the job's Running condition, written by the operator"),
)
# Not a step on the way but a precondition beside it: the stage alone is measured from the infrastructure.
SIDE_STAGES = {"volume provisioned": "infrastructure created", "claim bound": "infrastructure created"}
CHILD_KINDS = ",".join(k.kubectl_name for k in CHILD_KIND_RECORDS)


def _ts(value: Any) -> float | None:
    if not value:
        return None
    return datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def _condition_time(obj: Obj, kind: str) -> float | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return _ts(cond.get("lastTransitionTime"))
    return None


def _bound_time(claim: Obj) -> float | None:
    """When the PV controller (in kube-controller-manager) last wrote the claim: binding it to its volume."""
    times = [
        _ts(entry.get("time"))
        for entry in (claim.get("metadata") or {}).get("managedFields") or []
        if entry.get("manager") == "kube-controller-manager"
    ]
    return max((t for t in times if t is not None), default=None)


def job_timelines(jobs: list[Obj], children: list[Obj], volumes: list[Obj]) -> list[dict[str, float]]:
    """Per job that reached Running: each stage of STAGES as seconds since the job's creationTimestamp."""
    by_job: dict[tuple[str, str], list[Obj]] = {}
    for child in children:
        meta = child["metadata"]
        by_job.setdefault((meta["namespace"], meta["labels"]["grpo.dev/job"]), []).append(child)
    pv_created = {v["metadata"]["name"]: _ts(v["metadata"].get("creationTimestamp")) for v in volumes}
    out = []
    for job in jobs:
        meta = job["metadata"]
        status = job.get("status") or {}
        running = _condition_time(job, "Running")
        applied = _ts(meta.get("creationTimestamp"))
        kids = by_job.get((meta["namespace"], meta["name"]), [])
        gang = [c for c in kids if c["kind"] == "Pod" and c["metadata"]["labels"].get(LABEL_ROLE) != "metric"]
        infra = [c for c in kids if c["kind"] != "Pod"]
        if status.get("phase") != "Running" or running is None or applied is None or not gang or not infra:
            continue
        created = [_ts(c["metadata"]["creationTimestamp"]) or 0.0 for c in kids if c in gang or c in infra]
        bound = [_condition_time(p, "PodScheduled") for p in gang]
        ready = [_condition_time(p, "Ready") for p in gang]
        claims = [c for c in infra if c["kind"] == "PersistentVolumeClaim"]
        provisioned = [pv_created.get(str((c.get("spec") or {}).get("volumeName"))) for c in claims]
        claim_bound = [_bound_time(c) for c in claims]
        if None in bound or None in ready or not claims or None in provisioned or None in claim_bound:
            continue
        moments = {
            "applied": applied,
            "first reconcile": _ts(status.get("startTime")) or applied,
            "first child created": min(created),
            "infrastructure created": max(_ts(c["metadata"]["creationTimestamp"]) or 0.0 for c in infra),
            "gang pods created": max(_ts(c["metadata"]["creationTimestamp"]) or 0.0 for c in gang),
            "volume provisioned": max(t for t in provisioned if t is not None),
            "claim bound": max(t for t in claim_bound if t is not None),
            "gang pods bound": max(t for t in bound if t is not None),
            "gang pods Running": max(t for t in ready if t is not None),
            "status Running": running,
        }
        out.append({stage: moments[stage] - applied for stage, _ in STAGES})
    return out


def summarize_timelines(timelines: list[dict[str, float]]) -> dict[str, tuple[float, float, float, float]]:
    summary: dict[str, tuple[float, float, float, float]] = {}
    previous: str | None = None
    for stage, _ in STAGES:
        since_apply = [t[stage] for t in timelines]
        before = SIDE_STAGES.get(stage, previous)
        alone = [t[stage] - t[before] for t in timelines] if before else since_apply
        if since_apply:
            summary[stage] = (
                median(since_apply),
                percentile(since_apply, 95),
                median(alone),
                percentile(alone, 95),
            )
        if stage not in SIDE_STAGES:
            previous = stage
    return summary


def read_timelines(cluster: BenchCluster, namespaces: list[str]) -> list[dict[str, float]]:
    jobs: list[Obj] = []
    children: list[Obj] = []
    for namespace in namespaces:
        jobs += cluster.get_list("grpojobs", namespace)
        children += cluster.get_list(CHILD_KINDS, namespace, selector="grpo.dev/job", managed_fields=True)
    return job_timelines(jobs, children, cluster.get_list("persistentvolumes"))


def timeline_report(results: list[SizeResult]) -> str:
    width = max(len(stage) for stage, _ in STAGES) + 2
    lines = [
        "time since apply, p50 / p95, and the stage alone, p50 / p95 (seconds; API server timestamps, 1 s resolution)",
        f"{'':{width}}" + "".join(f"{str(r.jobs) + ' jobs':>26}" for r in results),
    ]
    for stage, _ in STAGES:
        cells = []
        for r in results:
            row = r.timeline.get(stage)
            cells.append(f"{row[0]:5.1f}/{row[1]:5.1f} +{row[2]:4.1f}/{row[3]:4.1f}" if row else "n/a")
        lines.append(f"{stage:{width}}" + "".join(f"{c:>26}" for c in cells))
    return "\n".join(lines)


def requests_report(results: list[SizeResult]) -> str:
    """Where the operator's requests go, by its own counter: per job during the ramp, and in the idle window."""
    lines = [
        "operator requests by verb and resource (its own counter): per job until all Running (ramp) | per job "
        "from then until quiet (settling) | in the idle window"
    ]
    for r in results:
        ramp = ", ".join(f"{k} {v:.2f}" for k, v in r.ramp_requests_per_job_by_kind.items()) or "none"
        settling = ", ".join(f"{k} {v:.2f}" for k, v in r.settling_requests_per_job_by_kind.items()) or "none"
        idle = ", ".join(f"{k} {v:.0f}" for k, v in r.idle_requests_by_kind.items()) or "none"
        lines.append(
            f"{r.jobs:>5} jobs: {ramp} | settling ({r.quiet_after_s:.0f}s): {settling} | "
            f"idle {r.idle_seconds:.0f}s: {idle}"
        )
    lines.append("of which Events, per job until quiet, by type and reason (grpo_operator_events_total)")
    for r in results:
        events = ", ".join(f"{k} {v:.2f}" for k, v in r.events_per_job_by_reason.items()) or "none"
        lines.append(f"{r.jobs:>5} jobs: {events}")
    return "\n".join(lines)


def floor(
    cluster: BenchCluster, manifests: list[Obj], tag: str, timeout: float
) -> tuple[float, float, float]:
    """(create seconds, seconds until all schedulable gang pods Running, all clients' requests)."""
    namespaces = sorted({f"floor-{m['metadata']['namespace']}" for m in manifests})
    create_namespaces(cluster, namespaces)
    children: list[Obj] = []
    expected: set[tuple[str, str]] = set()
    for manifest in manifests:
        floor_manifest = {**manifest, "metadata": {**manifest["metadata"]}}
        floor_manifest["metadata"]["namespace"] = f"floor-{manifest['metadata']['namespace']}"
        objs = children_of(floor_manifest)
        children += objs
        if schedulable(manifest["metadata"]["labels"]["grpo.dev/bench-kind"]):
            for obj in objs:
                if obj["kind"] == "Pod":
                    expected.add((obj["metadata"]["namespace"], obj["metadata"]["name"]))
    running: set[tuple[str, str]] = set()
    done = threading.Event()
    finished_at: list[float] = []

    def on_pod(type_: str, pod: Obj, t: float) -> None:
        key = (pod["metadata"].get("namespace", ""), pod["metadata"]["name"])
        if key in expected and (pod.get("status") or {}).get("phase") == "Running" and key not in running:
            running.add(key)
            if len(running) == len(expected):
                finished_at.append(t)
                done.set()

    api = cluster.api()
    informer = pod_informer(api, on_pod)
    informer.start()
    informer.synced.wait(60)
    path = write_list(children)
    before = RequestCounts.read(cluster)
    log(f"[{tag}] floor: kubectl create of {len(children)} objects ({len(expected)} gang pods to run)")
    t0 = time.monotonic()
    cluster.kubectl("create", "-f", path, timeout=timeout)
    t_create = time.monotonic() - t0
    log(f"[{tag}] floor: created in {t_create:.1f}s; waiting for the pods to run")
    if not done.wait(timeout):
        raise TimeoutError(f"floor: only {len(running)}/{len(expected)} pods Running after {timeout:.0f}s")
    t_running = finished_at[0] - t0
    requests = (RequestCounts.read(cluster) - before).everyone
    informer.stop()
    os.unlink(path)
    log(f"[{tag}] floor: all pods Running after {t_running:.1f}s; cleaning up")
    waited = settle(cluster, namespaces)
    log(f"[{tag}] floor: namespaces and volumes gone after {waited:.0f}s")
    return t_create, t_running, requests


def operator_run(
    cluster: BenchCluster,
    op_kubeconfig: Path,
    manifests: list[Obj],
    tag: str,
    idle: float,
    timeout: float,
    workdir: Path,
    operator_args: list[str],
    source: Path | None,
    kueue: bool = False,
    program: list[str] | None = None,
) -> dict[str, Any]:
    namespaces = sorted({m["metadata"]["namespace"] for m in manifests})
    create_namespaces(cluster, namespaces)
    if kueue:
        kueue_namespaces(cluster, namespaces)
    sizes = {(m["metadata"]["namespace"], m["metadata"]["name"]): gang_size(m) for m in manifests}
    # (namespace, job) -> names of its gang pods seen without Kueue's gate; the job's admission time.
    ungated: dict[tuple[str, str], set[str]] = {}
    admitted: dict[str, float] = {}

    def on_pod(type_: str, pod: Obj, t: float) -> None:
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        key = (meta.get("namespace", ""), labels.get(LABEL_JOB, ""))
        if key not in sizes or labels.get("grpo.dev/role") not in ("trainer", "generation"):
            return
        if type_ != "DELETED" and not (pod.get("spec") or {}).get("schedulingGates"):
            seen = ungated.setdefault(key, set())
            seen.add(meta["name"])
            if len(seen) == sizes[key]:
                admitted.setdefault(f"{key[0]}/{key[1]}", t)

    kinds = {
        (m["metadata"]["namespace"], m["metadata"]["name"]): m["metadata"]["labels"]["grpo.dev/bench-kind"]
        for m in manifests
    }
    ramp = Ramp()
    settled: set[tuple[str, str]] = set()
    done = threading.Event()

    def on_job(type_: str, job: Obj, t: float) -> None:
        meta = job["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        if key not in kinds:
            return
        name = f"{key[0]}/{key[1]}"
        ramp.started.setdefault(name, t)
        status = job.get("status") or {}
        if schedulable(kinds[key]):
            if status.get("phase") == "Running":
                ramp.running.setdefault(name, t)
                settled.add(key)
        elif status.get("phase") == "Pending" and status.get("reason") == "Unschedulable":
            settled.add(key)
        if len(settled) == len(kinds):
            done.set()

    op = OperatorProcess(
        op_kubeconfig,
        workdir / f"operator-{tag}.log",
        extra_args=operator_args,
        source=source,
        program=program,
    )
    op.start()
    api = cluster.api()
    informer = job_informer(api, on_job)
    informer.start()
    informer.synced.wait(60)
    pods_seen = pod_informer(api, on_pod)
    if kueue:
        pods_seen.start()
        pods_seen.synced.wait(60)
    time.sleep(2)  # let the operator's initial lists and watches finish before counting
    path = write_list(manifests)
    before = RequestCounts.read(cluster)
    cpu0, _ = op.sample()
    busy0, total0 = machine_cpu()
    load0 = os.getloadavg()[0]
    reconciles0 = _operator_metric(op, "grpo_operator_reconcile_total", without='result="gone"')
    requests0 = _operator_series(op, "grpo_operator_api_requests_total")
    events0 = _operator_series(op, "grpo_operator_events_total")
    log(f"[{tag}] operator: applying {len(manifests)} GRPOJobs")
    t0 = time.monotonic()
    cluster.kubectl("apply", "--server-side", "-f", path, timeout=timeout)
    t_apply = time.monotonic() - t0
    log(f"[{tag}] operator: applied in {t_apply:.1f}s; waiting for every job to settle")
    if not done.wait(timeout):
        stuck = sorted(set(kinds) - settled)
        raise TimeoutError(
            f"{len(stuck)} jobs did not settle in {timeout:.0f}s, e.g. {stuck[:5]}; see {op.log_path}"
        )
    t_b = time.monotonic() - t0
    # The end is when the last job's Running was observed (not when this thread woke up).
    t_b = min(t_b, max(ramp.running.values(), default=t0) - t0) if ramp.running else t_b
    after = RequestCounts.read(cluster)
    cpu1, _ = op.sample()
    busy1, total1 = machine_cpu()
    load1 = os.getloadavg()[0]
    ramp_reconciles = (
        _operator_metric(op, "grpo_operator_reconcile_total", without='result="gone"') - reconciles0
    )
    requests1 = _operator_series(op, "grpo_operator_api_requests_total")
    # Every job is Running, but the cluster is not yet still: metric pods (on the few CPU nodes) become
    # ready after the gangs, and each job's MetricReady condition follows them. The idle window starts
    # once the operator has sent nothing for QUIET_SECONDS, so it measures the operator at rest.
    quiet_after = _wait_until_quiet(op, timeout=180.0)
    log(
        f"[{tag}] operator: all settled after {t_b:.1f}s, quiet {quiet_after:.1f}s later; idle for {idle:.0f}s"
    )
    idle0 = RequestCounts.read(cluster)
    requests_idle0 = _operator_series(op, "grpo_operator_api_requests_total")
    events1 = _operator_series(op, "grpo_operator_events_total")
    cpu_idle0, _ = op.sample()
    time.sleep(idle)
    idle1 = RequestCounts.read(cluster)
    requests_idle1 = _operator_series(op, "grpo_operator_api_requests_total")
    cpu_idle1, rss = op.sample()
    reconciles = _operator_metric(op, "grpo_operator_reconcile_total")
    timelines = read_timelines(cluster, namespaces)
    informer.stop()
    if kueue:
        pods_seen.stop()
    os.unlink(path)
    log(f"[{tag}] operator: cleaning up")
    # Jobs first: their children go with them (garbage collector), so the operator never sees a
    # namespace deletion take pods from under a live job.
    for namespace in namespaces:
        cluster.kubectl("delete", "grpojobs", "--all", "-n", namespace, "--wait=false")
    delete_namespaces(cluster, namespaces)

    def pods_gone() -> bool:
        if kueue:
            stop_deleted_pods(cluster)
        return bool(gpu_pods(cluster) == 0)

    wait_for("the jobs' pods to be gone", pods_gone, timeout=600, interval=2)
    op.stop()
    waited = settle(cluster, namespaces)
    log(f"[{tag}] operator: namespaces and volumes gone after {waited:.0f}s")
    durations = ramp.durations()
    admission = [admitted[k] - ramp.started[k] for k in admitted if k in ramp.started]
    ramp_counts = after - before
    return {
        "apply_s": t_apply,
        "running_s": t_b,
        "durations": durations,
        "operator_requests": ramp_counts.operator,
        "all_requests": ramp_counts.everyone,
        "by_verb": ramp_counts.everyone_by_verb,
        "idle_requests_per_min": (idle1 - idle0).operator * 60.0 / idle,
        "idle_cpu_per_min": (cpu_idle1 - cpu_idle0) * 60.0 / idle,
        "cpu_s": cpu1 - cpu0,
        "cpu_total_s": cpu_idle1,
        "rss": rss,
        "busy": (busy1 - busy0) / max(1e-9, (total1 - total0)),
        "load0": load0,
        "load1": load1,
        "reconciles": reconciles,
        "admission": admission,
        "ramp_reconciles": ramp_reconciles,
        # The operator's own count, by verb and resource: where its requests go.
        "ramp_requests_by_kind": _growth_by_labels(requests0, requests1),
        "quiet_after_s": quiet_after,
        "idle_requests_by_kind": _growth_by_labels(requests_idle0, requests_idle1),
        "settling_requests_by_kind": _growth_by_labels(requests1, requests_idle0),
        "events_by_reason": _growth_by_labels(events0, events1, ("type", "reason")),
        "timeline": summarize_timelines(timelines),
    }


def _operator_series(op: OperatorProcess, name: str) -> dict[str, float]:
    """The operator's metric ``name``: value by label set (the text between the braces)."""
    import re
    import urllib.request

    match = re.search(r"/readyz on http://[^:]+:(\d+)", op.log_tail())
    if not match:
        return {}
    with urllib.request.urlopen(f"http://127.0.0.1:{match.group(1)}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    series: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1 :].rsplit("} ", 1)
            series[labels] = float(value)
    return series


def _operator_metric(op: OperatorProcess, name: str, without: str = "\0") -> float:
    """Sum of the operator's metric ``name`` over its series, leaving out series whose labels contain
    ``without`` (e.g. reconciles of jobs that were gone: the floor's children being deleted meanwhile)."""
    series = _operator_series(op, name)
    # No series yet is a count of 0 (a labelled counter has none until first counted).
    return sum(value for labels, value in series.items() if without not in labels)


QUIET_SECONDS = 10.0


def _wait_until_quiet(op: OperatorProcess, timeout: float) -> float:
    """Seconds until the operator's own request counter stayed unchanged for QUIET_SECONDS (or timeout)."""
    start = time.monotonic()
    last = _operator_series(op, "grpo_operator_api_requests_total")
    still_since = start
    while time.monotonic() - start < timeout:
        time.sleep(1.0)
        now = _operator_series(op, "grpo_operator_api_requests_total")
        if now != last:
            last, still_since = now, time.monotonic()
        elif time.monotonic() - still_since >= QUIET_SECONDS:
            return still_since - start
    return time.monotonic() - start


def _growth_by_labels(
    before: dict[str, float], after: dict[str, float], labels_: tuple[str, str] = ("verb", "resource")
) -> dict[str, float]:
    """The growth of one of the operator's counters between two reads, by two of its labels (its API
    requests by "verb resource", its Events by "type reason")."""
    out: dict[str, float] = {}
    for labels, value in after.items():
        fields = {k: v.strip('"') for k, v in (part.split("=", 1) for part in labels.split(","))}
        key = f"{fields[labels_[0]]} {fields[labels_[1]]}"
        delta = value - before.get(labels, 0.0)
        if delta:
            out[key] = out.get(key, 0.0) + delta
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def run_size(
    cluster: BenchCluster,
    op_kubeconfig: Path,
    count: int,
    idle: float,
    timeout: float,
    workdir: Path,
    operator_args: list[str],
    source: Path | None,
    skip_floor: bool = False,
    kueue: bool = False,
    program: list[str] | None = None,
) -> SizeResult:
    tag = f"{count} jobs"
    run = time.strftime("%H%M%S")
    namespaces = [f"s{count}-{run}-t{i}" for i in range(NAMESPACES_PER_RUN)]
    manifests = bench_jobs(count, namespaces)
    if kueue:
        manifests = [queued(m) for m in manifests]
    fit = [m for m in manifests if schedulable(m["metadata"]["labels"]["grpo.dev/bench-kind"])]
    child_objects = sum(len(children_of(m)) for m in manifests)
    nan = float("nan")
    create_s, floor_s, floor_requests = (
        (nan, nan, nan) if skip_floor else floor(cluster, manifests, tag, timeout)
    )
    res = operator_run(
        cluster, op_kubeconfig, manifests, tag, idle, timeout, workdir, operator_args, source, kueue, program
    )
    durations = res["durations"]
    return SizeResult(
        jobs=count,
        schedulable_jobs=len(fit),
        child_objects=child_objects,
        floor_create_s=create_s,
        floor_running_s=floor_s,
        operator_running_s=res["running_s"],
        apply_s=res["apply_s"],
        ratio=res["running_s"] / floor_s,
        ratio_to_create=res["running_s"] / create_s,
        p50_s=median(durations),
        p95_s=percentile(durations, 95),
        max_s=max(durations) if durations else float("nan"),
        operator_requests=res["operator_requests"],
        operator_requests_per_job=res["operator_requests"] / count,
        all_requests_per_job=res["all_requests"] / count,
        floor_requests_per_job=floor_requests / count,
        idle_seconds=idle,
        idle_operator_requests_per_min=res["idle_requests_per_min"],
        operator_cpu_s=res["cpu_s"],
        operator_cpu_s_per_job=res["cpu_s"] / count,
        idle_operator_cpu_s_per_min=res["idle_cpu_per_min"],
        operator_peak_rss_mib=res["rss"] / 2**20,
        machine_busy_fraction=res["busy"],
        load_avg_start=res["load0"],
        load_avg_end=res["load1"],
        reconcile_total=res["reconciles"],
        ramp_reconciles_per_job=res["ramp_reconciles"] / count,
        timeline=res["timeline"],
        ramp_requests_per_job_by_kind={k: v / count for k, v in res["ramp_requests_by_kind"].items()},
        idle_requests_by_kind=res["idle_requests_by_kind"],
        settling_requests_per_job_by_kind={k: v / count for k, v in res["settling_requests_by_kind"].items()},
        events_per_job_by_reason={k: v / count for k, v in res["events_by_reason"].items()},
        quiet_after_s=res["quiet_after_s"],
        kueue=kueue,
        admitted_p50_s=median(res["admission"]) if res["admission"] else nan,
        admitted_p95_s=percentile(res["admission"], 95) if res["admission"] else nan,
    )


ROWS: list[tuple[str, str, str]] = [
    ("jobs (schedulable)", "jobs", "{r.jobs} ({r.schedulable_jobs})"),
    ("child objects created", "child_objects", "{r.child_objects}"),
    ("(a) floor: kubectl create", "floor_create_s", "{r.floor_create_s:.1f} s"),
    ("(a) floor: create -> all Running", "floor_running_s", "{r.floor_running_s:.1f} s"),
    ("(b) operator: apply -> all Running", "operator_running_s", "{r.operator_running_s:.1f} s"),
    ("    of which kubectl apply", "apply_s", "{r.apply_s:.1f} s"),
    ("b/a (a = create -> Running)", "ratio", "{r.ratio:.2f}"),
    ("b/a (a = kubectl create only)", "ratio_to_create", "{r.ratio_to_create:.2f}"),
    ("through Kueue", "kueue", "{r.kueue}"),
    ("time to Kueue admission p50", "admitted_p50_s", "{r.admitted_p50_s:.1f} s"),
    ("time to Kueue admission p95", "admitted_p95_s", "{r.admitted_p95_s:.1f} s"),
    ("time to Running p50", "p50_s", "{r.p50_s:.1f} s"),
    ("time to Running p95", "p95_s", "{r.p95_s:.1f} s"),
    ("time to Running max", "max_s", "{r.max_s:.1f} s"),
    ("operator API requests / job", "operator_requests_per_job", "{r.operator_requests_per_job:.1f}"),
    ("all clients' requests / job", "all_requests_per_job", "{r.all_requests_per_job:.1f}"),
    ("  (floor: all clients / job)", "floor_requests_per_job", "{r.floor_requests_per_job:.1f}"),
    (
        "operator idle requests / min",
        "idle_operator_requests_per_min",
        "{r.idle_operator_requests_per_min:.1f}",
    ),
    ("operator CPU s (ramp)", "operator_cpu_s", "{r.operator_cpu_s:.1f}"),
    ("operator CPU s / job", "operator_cpu_s_per_job", "{r.operator_cpu_s_per_job:.3f}"),
    ("operator idle CPU s / min", "idle_operator_cpu_s_per_min", "{r.idle_operator_cpu_s_per_min:.2f}"),
    ("operator peak RSS", "operator_peak_rss_mib", "{r.operator_peak_rss_mib:.0f} MiB"),
    ("reconciles (whole run)", "reconcile_total", "{r.reconcile_total:.0f}"),
    ("reconciles / job (ramp)", "ramp_reconciles_per_job", "{r.ramp_reconciles_per_job:.1f}"),
    ("machine CPU busy during (b)", "machine_busy_fraction", "{r.machine_busy_fraction:.0%}"),
    ("load average start/end of (b)", "load_avg_start", "{r.load_avg_start:.1f}/{r.load_avg_end:.1f}"),
]


def report(results: list[SizeResult]) -> str:
    lines = []
    width = max(len(label) for label, _, _ in ROWS)
    header = f"{'':{width}}  " + "  ".join(f"{r.jobs:>12} jobs" for r in results)
    if len(results) > 1:
        header += f"  {'growth ' + str(results[0].jobs) + '->' + str(results[-1].jobs):>18}"
    lines.append(header)
    for label, attr, fmt in ROWS:
        cells = "  ".join(f"{fmt.format(r=r):>17}" for r in results)
        line = f"{label:{width}}  {cells}"
        if len(results) > 1 and attr not in ("jobs", "machine_busy_fraction", "load_avg_start"):
            first, last = getattr(results[0], attr), getattr(results[-1], attr)
            if first:
                line += f"  {last / first:>17.2f}x"
        lines.append(line)
    return "\n".join(lines)


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, action="append", help="job counts (repeat; default 30, 100, 300)")
    parser.add_argument("--cluster", default="grpo-scale", help="local cluster name (default grpo-scale)")
    parser.add_argument("--gpu-nodes", type=int, default=100)
    parser.add_argument("--cpu-nodes", type=int, default=4)
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of idle measurement (default 60)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="per phase (default 1800 s)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "grpo-bench")
    parser.add_argument(
        "--operator-arg", action="append", default=[], help="extra `grpo-operator run` argument (repeat)"
    )
    parser.add_argument(
        "--operator-source",
        type=Path,
        help="run the operator from this source tree (e.g. `git worktree add /tmp/before <commit>`) "
        "instead of the installed one, for before/after figures",
    )
    parser.add_argument(
        "--skip-floor", action="store_true", help="measure only (b) (the floor does not change)"
    )
    parser.add_argument(
        "--kueue",
        action="store_true",
        help="queue every job through one Kueue ClusterQueue (skips the floor)",
    )
    parser.add_argument(
        "--runtime",
        choices=("informers", "kopf"),
        default="informers",
        help="who watches: the product runtime's own informers (default), or kopf's watching and indexes "
        "(bench/kopf_watching.py; same reconcile and plan application)",
    )
    args = parser.parse_args()
    sizes = args.jobs or [30, 100, 300]
    program = None
    if args.runtime == "kopf":
        tree = args.operator_source or Path(__file__).resolve().parents[1]
        program = [sys.executable, str(tree / "bench" / "kopf_watching.py")]
    args.workdir.mkdir(parents=True, exist_ok=True)
    log(f"cluster {args.cluster}: {args.gpu_nodes} GPU nodes x 8, {args.cpu_nodes} CPU nodes")
    cluster = BenchCluster.up(args.cluster, args.gpu_nodes, args.cpu_nodes)
    op_kubeconfig = operator_identity(cluster)
    cluster.kubectl("apply", "-f", str(Path(__file__).resolve().parents[1] / "crds"))
    if args.kueue:
        kueue_setup(cluster, args.gpu_nodes * 8)
    if gpu_pods(cluster):
        raise SystemExit(f"cluster {args.cluster} still runs GRPO pods from another run: remove them first")
    machine = {
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "uname": " ".join(os.uname()),
        "operator": str(args.operator_source or "installed"),
        "runtime": args.runtime,
        "cluster": args.cluster,
        "gpu_nodes": args.gpu_nodes,
        "cpu_nodes": args.cpu_nodes,
    }
    results = []
    for count in sizes:
        results.append(
            run_size(
                cluster,
                op_kubeconfig,
                count,
                args.idle,
                args.timeout,
                args.workdir,
                args.operator_arg,
                args.operator_source,
                args.skip_floor or args.kueue,
                args.kueue,
                program,
            )
        )
        print(report(results), flush=True)
        print(timeline_report(results), flush=True)
        print(requests_report(results), flush=True)
        if args.json:  # after every size, so an aborted run keeps what it measured
            args.json.write_text(
                json.dumps({"machine": machine, "results": [asdict(r) for r in results]}, indent=2)
            )
    print(f"\nmachine: {machine}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
