"""Chaos against the running operator; every scenario ends by checking the invariants (bench/_invariants.py).

    .venv/bin/python bench/chaos.py kill-operator      # kill -9 the operator mid-way through a 300-job ramp
    .venv/bin/python bench/chaos.py apiserver-outage   # the API server is down for 30 s
    .venv/bin/python bench/chaos.py node-loss          # a node with trainer pods is deleted
    .venv/bin/python bench/chaos.py pod-failures       # trainer pods fail at a steady rate
    .venv/bin/python bench/chaos.py metric-down        # jobs' metric Service/Deployment/pods go away
    .venv/bin/python bench/chaos.py all                # each in turn (exit status 1 if any fails)

Runs on the local cluster ``grpo-scale`` (hack/cluster.sh; 100 simulated 8-GPU nodes), each scenario
in namespaces of its own with a fresh operator (``grpo-operator run --all-namespaces``). Simulated
nodes run no containers: the script plays kubelet and trainer — it fails a pod by writing the
terminated container status a kubelet would, and reports a checkpoint as trainer rank 0 does (status
subresource of the GRPOJob). Prints what it did, timings, and PASS/FAIL per invariant check.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _bench import (
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_ROLE,
    BenchCluster,
    Obj,
    create_namespaces,
    delete_namespaces,
    gpu_pods,
    log,
    wait_for,
    write_list,
)
from _informers import Informer, job_informer, pod_informer
from _invariants import Expect, check, metric_ready
from _job_mix import bench_jobs, schedulable
from _operator_under_test import OperatorProcess, operator_identity
from kubernetes import client

REPO = Path(__file__).resolve().parents[1]
CHECKPOINT_STEP = 5


def checkpoint_of(name: str) -> dict[str, Any]:
    return {
        "lastStep": CHECKPOINT_STEP,
        "path": f"/workspace/checkpoints/step-{CHECKPOINT_STEP}",
        "time": "2026-11-29T08:00:00Z",
    }


@dataclass
class Scenario:
    """One chaos run: its own namespaces and operator, informers on jobs and pods, expectations."""

    cluster: BenchCluster
    op_kubeconfig: Path
    name: str
    jobs: int
    workdir: Path
    operator_args: list[str]
    namespaces: list[str] = field(default_factory=list)
    manifests: list[Obj] = field(default_factory=list)
    expect: dict[tuple[str, str], Expect] = field(default_factory=dict)
    op: OperatorProcess | None = None
    job_watch: Informer | None = None
    pod_watch: Informer | None = None
    api: client.ApiClient | None = None

    def __post_init__(self) -> None:
        run = time.strftime("%H%M%S")
        self.namespaces = [f"c-{self.name}-{run}-t{i}" for i in range(3)]
        self.manifests = bench_jobs(self.jobs, self.namespaces, prefix="c")
        for m in self.manifests:
            kind = m["metadata"]["labels"]["grpo.dev/bench-kind"]
            key = (m["metadata"]["namespace"], m["metadata"]["name"])
            self.expect[key] = (
                Expect() if schedulable(kind) else Expect(phase="Pending", reason="Unschedulable")
            )

    # --- set-up and tear-down ---------------------------------------------------------------------------

    def start_operator(self) -> None:
        if self.op is None:
            self.op = OperatorProcess(
                self.op_kubeconfig,
                self.workdir / f"chaos-{self.namespaces[0].rsplit('-', 1)[0]}.log",
                extra_args=self.operator_args,
            )
        self.op.start()

    def begin(self, apply: bool = True) -> None:
        create_namespaces(self.cluster, self.namespaces)
        self.api = self.cluster.api()
        self.job_watch = job_informer(self.api)
        self.pod_watch = pod_informer(self.api)
        self.job_watch.start()
        self.pod_watch.start()
        self.job_watch.synced.wait(60)
        self.pod_watch.synced.wait(60)
        self.start_operator()
        if apply:
            self.apply()

    def apply(self) -> None:
        path = write_list(self.manifests)
        self.cluster.kubectl("apply", "--server-side", "-f", path, timeout=1800)
        os.unlink(path)

    def end(self) -> None:
        if self.job_watch:
            self.job_watch.stop()
        if self.pod_watch:
            self.pod_watch.stop()
        for namespace in self.namespaces:
            self.cluster.kubectl("delete", "grpojobs", "--all", "-n", namespace, "--wait=false", check=False)
        delete_namespaces(self.cluster, self.namespaces)
        try:
            wait_for(
                "the scenario's pods to be gone", lambda: gpu_pods(self.cluster) == 0, timeout=900, interval=3
            )
        finally:
            if self.op is not None:
                self.op.stop()

    # --- views --------------------------------------------------------------------------------------------

    def job(self, key: tuple[str, str]) -> Obj | None:
        assert self.job_watch is not None
        with self.job_watch.lock:
            return self.job_watch.objects.get(key)

    def settled(self) -> list[tuple[str, str]]:
        """Jobs not (yet) in their expected phase."""
        out = []
        for key, want in self.expect.items():
            status = (self.job(key) or {}).get("status") or {}
            if status.get("phase") != want.phase or (want.reason and status.get("reason") != want.reason):
                out.append(key)
                continue
            attempt = int(status.get("trainerAttempt") or 0)
            behind = attempt < 1 + want.restarts + want.uncounted
            if want.phase == "Running" and (behind or not metric_ready(status)):
                out.append(key)
        return out

    def wait_settled(self, what: str, timeout: float) -> float:
        t0 = time.monotonic()
        last: list[Any] = []

        def done() -> bool:
            left = self.settled()
            last[:] = left
            return not left

        try:
            wait_for(what, done, timeout=timeout, interval=1)
        except TimeoutError:
            sample = [
                f"{k[0]}/{k[1]}: {((self.job(k) or {}).get('status') or {}).get('phase')}" for k in last[:5]
            ]
            raise TimeoutError(
                f"{len(last)} jobs not settled after {timeout:.0f}s ({what}), e.g. {sample}"
            ) from None
        return time.monotonic() - t0

    def running_jobs(self) -> list[tuple[str, str]]:
        return [
            k
            for k, want in self.expect.items()
            if want.phase == "Running" and ((self.job(k) or {}).get("status") or {}).get("phase") == "Running"
        ]

    def gang_pods(self, key: tuple[str, str]) -> list[Obj]:
        assert self.pod_watch is not None
        with self.pod_watch.lock:
            pods = list(self.pod_watch.objects.values())
        return [
            p
            for p in pods
            if p["metadata"].get("namespace") == key[0]
            and (p["metadata"].get("labels") or {}).get(LABEL_JOB) == key[1]
            and (p["metadata"].get("labels") or {}).get(LABEL_ROLE) in ("trainer", "generation")
            and not p["metadata"].get("deletionTimestamp")
        ]

    # --- playing trainer and kubelet ----------------------------------------------------------------------

    def report_checkpoints(self, keys: list[tuple[str, str]]) -> None:
        """As each job's trainer rank 0 would, all at once: one after the other, 1,000 reports on a busy
        API server took minutes, and the ramp went on meanwhile."""
        assert self.api is not None
        custom = client.CustomObjectsApi(self.api)

        def report(key: tuple[str, str]) -> None:
            ckpt = checkpoint_of(key[1])
            custom.patch_namespaced_custom_object_status(
                "grpo.dev", "v1alpha1", key[0], "grpojobs", key[1], {"status": {"checkpoint": ckpt}}
            )
            self.expect[key].checkpoint = ckpt

        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(report, keys))

    def fail_pod(self, pod: Obj, exit_code: int = 1, message: str = "chaos: trainer crashed") -> None:
        """What the kubelet writes when the container exits non-zero (restartPolicy Never)."""
        assert self.api is not None
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        container = pod["spec"]["containers"][0]
        body = {
            "status": {
                "phase": "Failed",
                "containerStatuses": [
                    {
                        "name": container["name"],
                        "image": container["image"],
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {
                            "terminated": {
                                "exitCode": exit_code,
                                "reason": "Error",
                                "message": message,
                                "startedAt": now,
                                "finishedAt": now,
                            }
                        },
                    }
                ],
            }
        }
        client.CoreV1Api(self.api).patch_namespaced_pod_status(
            pod["metadata"]["name"], pod["metadata"]["namespace"], body
        )

    def verdict(self, title: str) -> bool:
        report = check(self.cluster, self.namespaces, self.expect)
        ok: bool = report.print(title)
        assert self.op is not None
        if self.op.proc is not None and self.op.proc.poll() is not None:
            print(f"  - the operator exited (code {self.op.proc.returncode}); see {self.op.log_path}")
            ok = False
        return ok


# --- scenarios ----------------------------------------------------------------------------------------------


def kill_operator(s: Scenario, args: argparse.Namespace) -> bool:
    """kill -9 the operator when part of the ramp is Running; start it again; everything must converge
    with no restart and no child created twice."""
    s.begin(apply=False)
    runnable = [k for k, e in s.expect.items() if e.phase == "Running"]
    target = max(1, int(len(runnable) * args.kill_at))
    t0 = time.monotonic()
    import threading

    applier = threading.Thread(target=s.apply, daemon=True)
    applier.start()
    wait_for(f"{target} jobs Running", lambda: len(s.running_jobs()) >= target, timeout=1800, interval=0.5)
    assert s.op is not None
    s.report_checkpoints(s.running_jobs())
    running_at_kill = len(s.running_jobs())
    s.op.kill9()
    log(
        f"kill-operator: killed -9 at {time.monotonic() - t0:.1f}s with {running_at_kill}/{len(runnable)} Running"
    )
    time.sleep(args.down)
    s.start_operator()
    log(f"kill-operator: restarted after {args.down:.0f}s down")
    applier.join()
    settle = s.wait_settled("every job to settle after the restart", timeout=1800)
    log(f"kill-operator: all {len(s.expect)} jobs settled {settle:.1f}s after the restart")
    created = s.op.log_path.read_text().count("created Pod")
    expected_pods = sum(1 + int(m["spec"]["trainer"].get("nodes", 1)) for m in s.manifests)
    print(
        f"kill-operator: pod creations logged by both operator runs: {created} (pods needed: {expected_pods})"
    )
    return s.verdict("kill-operator")


def apiserver_outage(s: Scenario, args: argparse.Namespace) -> bool:
    """The API server is killed and started again after ``--down`` seconds (or frozen with SIGSTOP
    and thawed, with ``--freeze``). Afterwards the operator must still react: a trainer failure in
    every tenth running job must restart exactly that gang, counted once."""
    s.begin()
    settle = s.wait_settled("the jobs to run", timeout=1800)
    log(f"apiserver-outage: {len(s.expect)} jobs settled in {settle:.1f}s")
    s.report_checkpoints(s.running_jobs())
    time.sleep(2)
    pid = s.cluster.apiserver_pid()
    if args.freeze:
        os.kill(pid, signal.SIGSTOP)
        log(f"apiserver-outage: kube-apiserver (pid {pid}) frozen (SIGSTOP) for {args.down:.0f}s")
        time.sleep(args.down)
        os.kill(pid, signal.SIGCONT)
    else:
        os.kill(pid, signal.SIGKILL)
        log(f"apiserver-outage: kube-apiserver (pid {pid}) killed; down for {args.down:.0f}s")
        time.sleep(args.down)
    down = [name for name, p in s.cluster.component_pids().items() if p is None]
    # kube-scheduler and kube-controller-manager exit when they cannot renew their leader lease; in a
    # cluster the kubelet restarts them (static pods). kwokctl start does the same here.
    s.cluster.kwokctl("start", "cluster")
    t_back = time.monotonic()
    log(f"apiserver-outage: components not running after the outage: {down or 'none'}; started again")
    wait_for(
        "the API server to answer",
        lambda: s.cluster.kubectl("get", "--raw", "/readyz", check=False, timeout=10).returncode == 0,
        timeout=180,
        interval=1,
    )
    log(f"apiserver-outage: API server ready {time.monotonic() - t_back:.1f}s after the restart")
    time.sleep(15)
    late = [name for name, p in s.cluster.component_pids().items() if p is None]
    if late:  # a component that lost its lease only after the API server came back
        s.cluster.kwokctl("start", "cluster")
        log(f"apiserver-outage: {late} exited after the restart; started again")
    victims = s.running_jobs()[:: max(1, args.every)]
    t_fail = time.monotonic()
    for key in victims:
        trainer = next(p for p in s.gang_pods(key) if p["metadata"]["labels"][LABEL_ROLE] == "trainer")
        s.fail_pod(trainer)
        s.expect[key].restarts = 1
    log(
        f"apiserver-outage: failed a trainer pod in {len(victims)} jobs to prove the operator is watching again"
    )
    settle = s.wait_settled("the failed gangs to restart and run", timeout=900)
    log(f"apiserver-outage: restarted gangs Running {time.monotonic() - t_fail:.1f}s after the failures")
    return s.verdict("apiserver-outage")


def node_loss(s: Scenario, args: argparse.Namespace) -> bool:
    """The ``--nodes`` nodes with the most trainer pods are deleted at once (nodes that vanished): every
    job with a gang pod there restarts on other nodes, not counted against its backoffLimit, resuming
    from its checkpoint; every other job is untouched."""
    s.begin()
    settle = s.wait_settled("the jobs to run", timeout=1800)
    log(f"node-loss: {len(s.expect)} jobs settled in {settle:.1f}s")
    s.report_checkpoints(s.running_jobs())
    on_node: dict[str, set[tuple[str, str]]] = {}
    trainers: dict[str, int] = {}
    for key in s.running_jobs():
        for pod in s.gang_pods(key):
            node = pod["spec"].get("nodeName")
            if node:
                on_node.setdefault(node, set()).add(key)
                if pod["metadata"]["labels"][LABEL_ROLE] == "trainer":
                    trainers[node] = trainers.get(node, 0) + 1
    victims = sorted(trainers, key=lambda n: (-trainers[n], n))[: args.nodes]
    hits: dict[tuple[str, str], int] = {}
    for node in victims:
        for key in on_node[node]:
            hits[key] = hits.get(key, 0) + 1
    for key, count in hits.items():
        s.expect[key].uncounted = 1
        # A job with pods on two of the nodes restarts once if the operator sees both losses in one
        # reconcile, twice if its new pods landed on the second node before that one went.
        s.expect[key].attempt_at_least = count > 1
    saved = [json.loads(s.cluster.kubectl("get", "node", n, "-o", "json").stdout) for n in victims]
    t0 = time.monotonic()
    s.cluster.kubectl("delete", "node", *victims, "--wait=false")
    log(
        f"node-loss: deleted nodes {', '.join(victims)} ({sum(trainers[n] for n in victims)} trainer pods; "
        f"gang pods of {len(hits)} jobs)"
    )
    s.wait_settled("the affected gangs to run again elsewhere", timeout=900)
    log(f"node-loss: affected jobs Running again {time.monotonic() - t0:.1f}s after the nodes were deleted")
    ok = s.verdict("node-loss")
    # Put the nodes back for later runs, with their status: a simulated node's GPU capacity is only there.
    for node_obj in saved:
        for meta_field in (
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "managedFields",
            "deletionTimestamp",
        ):
            node_obj["metadata"].pop(meta_field, None)
        s.cluster.kubectl("apply", "-f", "-", input=json.dumps(node_obj), check=False)
    return ok


def pod_failures(s: Scenario, args: argparse.Namespace) -> bool:
    """A trainer pod of a random Running job fails every ``--interval`` seconds for ``--duration``
    seconds. Each failure is injected only into a gang that is Running at its current attempt, so each
    must cost exactly one counted restart; a job that fails more often than its backoffLimit must
    end Failed (BackoffLimitExceeded)."""
    s.begin()
    settle = s.wait_settled("the jobs to run", timeout=1800)
    log(f"pod-failures: {len(s.expect)} jobs settled in {settle:.1f}s")
    s.report_checkpoints(s.running_jobs())
    rng = random.Random(args.seed)
    limit = 3  # the default backoffLimit of the bench jobs
    injected: dict[tuple[str, str], int] = {}
    t0 = time.monotonic()
    failures = 0
    # One job is driven past its budget on purpose, to check the limit is honoured exactly.
    doomed = sorted(s.running_jobs())[0]
    while time.monotonic() - t0 < args.duration:
        tick = time.monotonic()
        candidates = []
        for key in s.running_jobs():
            job = s.job(key) or {}
            attempt = str((job.get("status") or {}).get("trainerAttempt"))
            pods = s.gang_pods(key)
            current = [p for p in pods if p["metadata"]["labels"].get(LABEL_ATTEMPT) == attempt]
            if injected.get(key, 0) >= limit + 1 or any(
                p["metadata"]["labels"].get(LABEL_ATTEMPT) != attempt for p in pods
            ):
                continue
            if current and all((p.get("status") or {}).get("phase") == "Running" for p in current):
                candidates.append((key, current))
        preferred = [c for c in candidates if c[0] == doomed]
        if candidates:
            key, current = preferred[0] if preferred else rng.choice(candidates)
            trainer = rng.choice([p for p in current if p["metadata"]["labels"][LABEL_ROLE] == "trainer"])
            s.fail_pod(trainer)
            injected[key] = injected.get(key, 0) + 1
            failures += 1
        time.sleep(max(0.0, args.interval - (time.monotonic() - tick)))
    for key, count in injected.items():
        if count > limit:
            s.expect[key].phase, s.expect[key].reason, s.expect[key].restarts = (
                "Failed",
                "BackoffLimitExceeded",
                limit,
            )
        else:
            s.expect[key].restarts = count
    log(
        f"pod-failures: {failures} trainer failures in {args.duration:.0f}s over {len(injected)} jobs "
        f"(max {max(injected.values(), default=0)} on one job; {doomed[1]} driven past its budget)"
    )
    s.wait_settled("every job to settle after the failures", timeout=900)
    log(f"pod-failures: all settled {time.monotonic() - t0 - args.duration:.1f}s after the last failure")
    return s.verdict("pod-failures")


def metric_down(s: Scenario, args: argparse.Namespace) -> bool:
    """Takes jobs' metric services down three ways: the Service and Deployment deleted, the Deployment
    scaled to zero, the metric pods deleted. The operator must bring the metric service back without
    touching the training gang (no restart, same attempt)."""
    s.begin()
    settle = s.wait_settled("the jobs to run", timeout=1800)
    log(f"metric-down: {len(s.expect)} jobs settled in {settle:.1f}s")
    s.report_checkpoints(s.running_jobs())
    running = sorted(s.running_jobs())
    groups = [running[0::3], running[1::3], running[2::3]]
    # Whether each job's status showed its outage (MetricReady not True), from every watch event, so a
    # status that is False for a second is not missed between two polls.
    assert s.job_watch is not None
    reported_down: set[tuple[str, str]] = set()
    chained = s.job_watch.on_event

    def on_job(type_: str, obj: Obj, t: float) -> None:
        meta = obj.get("metadata") or {}
        if type_ != "DELETED" and not metric_ready(obj.get("status") or {}):
            reported_down.add((str(meta.get("namespace")), str(meta.get("name"))))
        if chained is not None:
            chained(type_, obj, t)

    s.job_watch.on_event = on_job
    t0 = time.monotonic()
    for ns, name in groups[0]:
        s.cluster.kubectl("delete", "service,deployment", f"{name}-metric", "-n", ns, "--wait=false")
    for ns, name in groups[1]:
        s.cluster.kubectl("scale", "deployment", f"{name}-metric", "-n", ns, "--replicas=0")
    for ns, name in groups[2]:
        s.cluster.kubectl(
            "delete", "pods", "-n", ns, "-l", f"{LABEL_JOB}={name},{LABEL_ROLE}=metric", "--wait=false"
        )
    log(
        f"metric-down: deleted Service+Deployment of {len(groups[0])} jobs, scaled the Deployment of "
        f"{len(groups[1])} to 0, deleted the metric pods of {len(groups[2])}"
    )

    def back(keys: list[tuple[str, str]]) -> bool:
        for ns, name in keys:
            pods = s.cluster.get_list("pods", ns, f"{LABEL_JOB}={name},{LABEL_ROLE}=metric")
            live = [
                p
                for p in pods
                if not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") == "Running"
            ]
            if len(live) != 1:
                return False
        return True

    how = ("Service+Deployment deleted", "Deployment scaled to 0", "metric pods deleted")
    pending = dict(zip(how, groups, strict=True))
    touched = [key for keys in groups for key in keys]
    while pending and time.monotonic() - t0 < args.metric_timeout:
        for label, keys in list(pending.items()):
            if back(keys):
                log(f"metric-down: {label}: metric pods Running again after {time.monotonic() - t0:.1f}s")
                del pending[label]
        time.sleep(1)
    for label in pending:
        log(f"metric-down: {label}: metric service still down after {args.metric_timeout:.0f}s")
    s.job_watch.on_event = chained
    down = len(reported_down & set(touched))
    log(f"metric-down: {down} of {len(touched)} jobs reported MetricReady=False during the outage")
    for label, keys in zip(how, groups, strict=True):
        missed = sorted(f"{ns}/{name}" for ns, name in keys if (ns, name) not in reported_down)
        log(
            f"metric-down: {label}: {len(keys) - len(missed)} of {len(keys)} reported it"
            + (f"; never False: {', '.join(missed)}" if missed else "")
        )
    try:
        s.wait_settled("every job to report MetricReady=True again", timeout=120)
        log(
            f"metric-down: every job reports MetricReady=True again {time.monotonic() - t0:.1f}s after the outage"
        )
    except TimeoutError as exc:
        log(f"metric-down: {exc}")
    return s.verdict("metric-down")


SCENARIOS: dict[str, tuple[Callable[[Scenario, argparse.Namespace], bool], int]] = {
    "kill-operator": (kill_operator, 300),
    "apiserver-outage": (apiserver_outage, 60),
    "node-loss": (node_loss, 60),
    "pod-failures": (pod_failures, 60),
    "metric-down": (metric_down, 30),
}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("scenario", choices=[*SCENARIOS, "all"])
    parser.add_argument(
        "--jobs", type=int, help="jobs in the scenario (default: 300 for kill-operator, else 60/30)"
    )
    parser.add_argument("--cluster", default="grpo-scale")
    parser.add_argument("--gpu-nodes", type=int, default=100)
    parser.add_argument("--cpu-nodes", type=int, default=4)
    parser.add_argument(
        "--kill-at", type=float, default=0.4, help="kill-operator: fraction Running at the kill"
    )
    parser.add_argument("--down", type=float, default=None, help="seconds down (operator 5, API server 30)")
    parser.add_argument("--freeze", action="store_true", help="apiserver-outage: SIGSTOP instead of kill")
    parser.add_argument("--nodes", type=int, default=3, help="node-loss: nodes deleted at once")
    parser.add_argument(
        "--every", type=int, default=10, help="apiserver-outage: fail every Nth job afterwards"
    )
    parser.add_argument("--interval", type=float, default=3.0, help="pod-failures: seconds between failures")
    parser.add_argument("--duration", type=float, default=90.0, help="pod-failures: seconds of failures")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--metric-timeout", type=float, default=180.0)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "grpo-bench")
    parser.add_argument(
        "--operator-arg", action="append", default=[], help="extra `grpo-operator run` argument"
    )
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    cluster = BenchCluster.up(args.cluster, args.gpu_nodes, args.cpu_nodes)
    op_kubeconfig = operator_identity(cluster)
    cluster.kubectl("apply", "-f", str(REPO / "crds"))
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    results: dict[str, bool] = {}
    for name in names:
        fn, default_jobs = SCENARIOS[name]
        if gpu_pods(cluster):
            raise SystemExit(
                f"cluster {args.cluster} still runs GRPO pods from another run: remove them first"
            )
        scenario_args = argparse.Namespace(**vars(args))
        if scenario_args.down is None:
            scenario_args.down = 5.0 if name == "kill-operator" else 30.0
        s = Scenario(cluster, op_kubeconfig, name, args.jobs or default_jobs, args.workdir, args.operator_arg)
        log(f"=== {name}: {s.jobs} jobs in {', '.join(s.namespaces)}")
        try:
            results[name] = fn(s, scenario_args)
        except Exception as exc:  # report the scenario as failed and go on with the next
            log(f"{name}: {type(exc).__name__}: {exc}")
            results[name] = False
        finally:
            s.end()
    print("\n" + "\n".join(f"{name}: {'PASS' if ok else 'FAIL'}" for name, ok in results.items()))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
