"""The operator under benchmark: who it is to the API server, its process, and its own /metrics.

It runs as its own ServiceAccount, and a FlowSchema of its own puts every request it makes into one API
Priority and Fairness flow. The API server then counts them itself
(``apiserver_flowcontrol_dispatched_requests_total{flow_schema=...}``): ``apiserver_request_total`` has
no user or user-agent label, so this is the server-side count of one client's requests. ``OperatorProcess``
is ``grpo-operator run`` as a subprocess, with its CPU seconds and peak RSS.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from _bench import BenchCluster, Obj, metric_by, metric_sum, wait_for

OPERATOR_NAMESPACE = "grpo-bench-system"
OPERATOR_SA = "grpo-operator"
FLOW_SCHEMA = "grpo-bench-operator"


@dataclass
class RequestCounts:
    """The API server's own request counters at one moment."""

    operator: float  # requests of the operator's flow (APF dispatched)
    everyone: float  # apiserver_request_total, all clients
    everyone_by_verb: dict[str, float]

    @classmethod
    def read(cls, cluster: BenchCluster) -> RequestCounts:
        samples = cluster.metrics()
        return cls(
            operator=metric_sum(
                samples, "apiserver_flowcontrol_dispatched_requests_total", flow_schema=FLOW_SCHEMA
            ),
            everyone=metric_sum(samples, "apiserver_request_total"),
            everyone_by_verb=metric_by(samples, "apiserver_request_total", "verb"),
        )

    def __sub__(self, other: RequestCounts) -> RequestCounts:
        verbs = set(self.everyone_by_verb) | set(other.everyone_by_verb)
        return RequestCounts(
            self.operator - other.operator,
            self.everyone - other.everyone,
            {v: self.everyone_by_verb.get(v, 0) - other.everyone_by_verb.get(v, 0) for v in verbs},
        )


# --- the operator's identity ----------------------------------------------------------------------------------


def operator_identity(cluster: BenchCluster) -> Path:
    """ServiceAccount + FlowSchema for the operator; returns a kubeconfig that uses the SA's token.

    The ServiceAccount is bound to cluster-admin: these benchmarks measure load, not RBAC (the Helm
    chart's least-privilege role is tested in tests/helm). The FlowSchema sends the operator's requests
    to the same priority level as any other ServiceAccount (workload-low), so APF treats it as it would
    in a cluster, and the flow's dispatched-requests counter is exactly the operator's requests.
    """
    manifests: list[Obj] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": OPERATOR_SA, "namespace": OPERATOR_NAMESPACE},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "grpo-bench-operator"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": OPERATOR_NAMESPACE}],
        },
        {
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "FlowSchema",
            "metadata": {"name": FLOW_SCHEMA},
            "spec": {
                "matchingPrecedence": 1000,
                "priorityLevelConfiguration": {"name": "workload-low"},
                "distinguisherMethod": {"type": "ByUser"},
                "rules": [
                    {
                        "subjects": [
                            {
                                "kind": "ServiceAccount",
                                "serviceAccount": {"name": OPERATOR_SA, "namespace": OPERATOR_NAMESPACE},
                            }
                        ],
                        "resourceRules": [
                            {
                                "verbs": ["*"],
                                "apiGroups": ["*"],
                                "resources": ["*"],
                                "namespaces": ["*"],
                                "clusterScope": True,
                            }
                        ],
                        "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                    }
                ],
            },
        },
    ]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(manifests))
    token = cluster.kubectl(
        "create", "token", OPERATOR_SA, "-n", OPERATOR_NAMESPACE, "--duration=48h"
    ).stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    cluster_entry = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster_entry],
        "users": [{"name": "grpo-operator", "user": {"token": token}}],
        "contexts": [
            {"name": "operator", "context": {"cluster": cluster_entry["name"], "user": "grpo-operator"}}
        ],
        "current-context": "operator",
    }
    # Annotated: mypy does not find the sibling module `_bench` on its path, so its names are untyped here.
    path: Path = cluster.home / f"{cluster.name}.operator.kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    path.chmod(0o600)
    return path


# --- the operator process -------------------------------------------------------------------------------------


@dataclass
class OperatorProcess:
    kubeconfig: Path
    log_path: Path
    extra_args: list[str] = field(default_factory=list)
    # Run the operator from this source tree (its `operator/` folder) instead of the installed one:
    # how the before/after figures of an operator change are taken on one machine.
    source: Path | None = None
    # The command that takes `grpo-operator run`'s arguments (default: the installed `grpo-operator`); e.g.
    # bench/kopf_watching.py, the variant whose watches are kopf's own.
    program: list[str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    # CPU seconds of earlier (killed or stopped) processes of this operator, so totals span restarts.
    cpu_before: float = 0.0
    peak_rss: int = 0

    def start(self) -> None:
        self.starts += 1
        binary = Path(sys.executable).with_name("grpo-operator")
        if self.program is None and not binary.exists():
            raise RuntimeError(f"{binary} is missing: run `.venv/bin/pip install -e .` first")
        program = self.program or [str(binary)]
        with self.log_path.open("ab") as out:
            out.write(f"\n===== start {self.starts} =====\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                [*program, "run", "--all-namespaces", "--http-port", "0", *self.extra_args],
                env=self._env(),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_for("the operator to start", lambda: "grpo-operator started" in self.log_tail(), timeout=120)

    def _env(self) -> dict[str, str]:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        if self.source is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(self.source / "operator"), env.get("PYTHONPATH")])
            )
        return env

    def log_tail(self) -> str:
        text = self.log_path.read_text(errors="replace")
        return text.split(f"===== start {self.starts} =====")[-1]

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _proc_cpu(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks

    def _proc_hwm(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return 0

    def sample(self) -> tuple[float, int]:
        """(CPU seconds of every process of this operator so far, peak RSS in bytes of any of them)."""
        if self.proc is not None and self.proc.poll() is None:
            self.peak_rss = max(self.peak_rss, self._proc_hwm())
            return self.cpu_before + self._proc_cpu(), self.peak_rss
        return self.cpu_before, self.peak_rss

    def _retire(self) -> None:
        cpu, _ = self.sample()
        self.cpu_before = cpu

    def kill9(self) -> None:
        assert self.proc is not None
        self._retire()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self._retire()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


# --- the operator's own /metrics ------------------------------------------------------------------------


def operator_series(op: OperatorProcess, name: str) -> dict[str, float]:
    """The operator's metric ``name``: value by label set (the text between the braces)."""
    match = re.search(r"/readyz on http://[^:]+:(\d+)", op.log_tail())
    if not match:
        return {}
    # 60 s: at 3,000 jobs on two busy cores one answer took 12 s, and a 10 s limit lost a 50-minute run.
    with urllib.request.urlopen(f"http://127.0.0.1:{match.group(1)}/metrics", timeout=60) as resp:
        text = resp.read().decode()
    series: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1 :].rsplit("} ", 1)
            series[labels] = float(value)
    return series


def operator_metric(op: OperatorProcess, name: str, without: str = "\0") -> float:
    """Sum of the operator's metric ``name`` over its series, leaving out series whose labels contain
    ``without`` (e.g. reconciles of jobs that were gone: the floor's children being deleted meanwhile)."""
    series = operator_series(op, name)
    # No series yet is a count of 0 (a labelled counter has none until first counted).
    return sum(value for labels, value in series.items() if without not in labels)


QUIET_SECONDS = 10.0


def wait_until_quiet(op: OperatorProcess, timeout: float) -> float:
    """Seconds until the operator's own request counter stayed unchanged for QUIET_SECONDS (or timeout)."""
    start = time.monotonic()
    last = operator_series(op, "grpo_operator_api_requests_total")
    still_since = start
    while time.monotonic() - start < timeout:
        time.sleep(1.0)
        now = operator_series(op, "grpo_operator_api_requests_total")
        if now != last:
            last, still_since = now, time.monotonic()
        elif time.monotonic() - still_since >= QUIET_SECONDS:
            return still_since - start
    return time.monotonic() - start


def growth_by_labels(
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
