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
Fairness flow (bench/_operator_under_test.py explains why not apiserver_request_total, which is printed
for all clients for context). CPU seconds and peak RSS are read from /proc for the operator process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from _bench import (
    LABEL_JOB,
    BenchCluster,
    Obj,
    Ramp,
    create_namespaces,
    delete_namespaces,
    gpu_pods,
    log,
    machine_cpu,
    median,
    percentile,
    settle,
    wait_for,
    write_list,
)
from _informers import job_informer, pod_informer
from _job_mix import bench_jobs, children_of, gang_size, schedulable
from _operator_under_test import (
    OperatorProcess,
    RequestCounts,
    growth_by_labels,
    operator_identity,
    operator_metric,
    operator_series,
    wait_until_quiet,
)
from _scale_kueue import kueue_namespaces, kueue_setup, queued, stop_deleted_pods
from _scale_report import SizeResult, report, requests_report, timeline_report
from _scale_timelines import read_timelines, summarize_timelines

NAMESPACES_PER_RUN = 5


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


def clean_up_jobs(
    cluster: BenchCluster, op: OperatorProcess, namespaces: list[str], tag: str, kueue: bool, timeout: float
) -> None:
    """Deletes a phase's jobs and namespaces and waits until their pods and volumes are gone."""
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

    wait_for("the jobs' pods to be gone", pods_gone, timeout=timeout, interval=2)
    op.stop()
    waited = settle(cluster, namespaces)
    log(f"[{tag}] operator: namespaces and volumes gone after {waited:.0f}s")


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
    clean_up: bool = True,
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
    reconciles0 = operator_metric(op, "grpo_operator_reconcile_total", without='result="gone"')
    requests0 = operator_series(op, "grpo_operator_api_requests_total")
    events0 = operator_series(op, "grpo_operator_events_total")
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
        operator_metric(op, "grpo_operator_reconcile_total", without='result="gone"') - reconciles0
    )
    requests1 = operator_series(op, "grpo_operator_api_requests_total")
    # Every job is Running, but the cluster is not yet still: metric pods (on the few CPU nodes) become
    # ready after the gangs, and each job's MetricReady condition follows them. The idle window starts
    # once the operator has sent nothing for QUIET_SECONDS, so it measures the operator at rest.
    quiet_after = wait_until_quiet(op, timeout=180.0)
    log(
        f"[{tag}] operator: all settled after {t_b:.1f}s, quiet {quiet_after:.1f}s later; idle for {idle:.0f}s"
    )
    idle0 = RequestCounts.read(cluster)
    requests_idle0 = operator_series(op, "grpo_operator_api_requests_total")
    events1 = operator_series(op, "grpo_operator_events_total")
    cpu_idle0, _ = op.sample()
    time.sleep(idle)
    idle1 = RequestCounts.read(cluster)
    requests_idle1 = operator_series(op, "grpo_operator_api_requests_total")
    cpu_idle1, rss = op.sample()
    reconciles = operator_metric(op, "grpo_operator_reconcile_total")
    timelines = read_timelines(cluster, namespaces)
    informer.stop()
    if kueue:
        pods_seen.stop()
    os.unlink(path)
    if clean_up:
        clean_up_jobs(cluster, op, namespaces, tag, kueue, timeout)
    else:
        op.stop()
        log(f"[{tag}] operator: stopped; the jobs are left in place (tear the cluster down)")
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
        "ramp_requests_by_kind": growth_by_labels(requests0, requests1),
        "quiet_after_s": quiet_after,
        "idle_requests_by_kind": growth_by_labels(requests_idle0, requests_idle1),
        "settling_requests_by_kind": growth_by_labels(requests1, requests_idle0),
        "events_by_reason": growth_by_labels(events0, events1, ("type", "reason")),
        "timeline": summarize_timelines(timelines),
    }


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
    clean_up: bool = True,
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
        cluster, op_kubeconfig, manifests, tag, idle, timeout, workdir, operator_args, source, kueue, program,
        clean_up,
    )  # fmt: skip
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
        "--leave-last",
        action="store_true",
        help="leave the last size's jobs in place instead of deleting them and waiting for their pods, "
        "namespaces and volumes to go (at 3,000 jobs, many minutes); tear the cluster down afterwards",
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
                clean_up=not (args.leave_last and count == sizes[-1]),
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
