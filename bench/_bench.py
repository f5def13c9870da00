"""Shared machinery of the scale and chaos benchmarks (bench/scale.py, bench/chaos.py).

* ``BenchCluster``: the local control plane (hack/cluster.sh) under its own name, kubectl, the API
  server's /metrics, and its component processes (for the chaos scripts).
* The operator's identity: it runs as its own ServiceAccount, and a FlowSchema of its own puts every
  request it makes into one API Priority and Fairness flow. The API server then counts them itself
  (``apiserver_flowcontrol_dispatched_requests_total{flow_schema=...}``): ``apiserver_request_total``
  has no user or user-agent label, so this is the server-side count of one client's requests.
* ``OperatorProcess``: ``grpo-operator run`` as a subprocess, with its CPU seconds and peak RSS.
* ``Informer``: list+watch of one resource in a thread, keeping the latest objects and the time each
  was first seen and first seen in a given state.
* The job mix: sizes that fit, and sizes and placements that can never fit the simulated nodes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

REPO = Path(__file__).resolve().parents[1]
HACK = REPO / "hack"
Obj = dict[str, Any]

OPERATOR_NAMESPACE = "grpo-bench-system"
OPERATOR_SA = "grpo-operator"
FLOW_SCHEMA = "grpo-bench-operator"
LABEL_JOB = "grpo.dev/job"
LABEL_ROLE = "grpo.dev/role"
LABEL_ATTEMPT = "grpo.dev/attempt"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def wait_for(what: str, fn: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last: {str(last)[:2000]})")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100.0 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# --- the cluster --------------------------------------------------------------------------------------------


def _testbins() -> Path:
    return Path(os.environ.get("GRPO_TESTBINS", Path.home() / ".cache" / "grpo-testbins"))


def _version(key: str) -> str:
    for line in (HACK / "versions.env").read_text().splitlines():
        if line.startswith(f"{key}="):
            return os.environ.get(key) or line.split(":-", 1)[-1].rstrip('}"')
    raise RuntimeError(f"{key} missing from hack/versions.env")


@dataclass
class BenchCluster:
    name: str
    kubeconfig: Path
    kubectl_bin: str
    home: Path

    @classmethod
    def up(cls, name: str, gpu_nodes: int, cpu_nodes: int) -> BenchCluster:
        """Starts (or reuses) the local cluster ``name`` via hack/cluster.sh."""
        env = {
            **os.environ,
            "GRPO_CLUSTER_NAME": name,
            "GPU_NODES": str(gpu_nodes),
            "CPU_NODES": str(cpu_nodes),
        }
        out = subprocess.run(
            ["bash", str(HACK / "cluster.sh"), "up"], env=env, capture_output=True, text=True, check=False
        )
        if out.returncode != 0:
            raise RuntimeError(f"hack/cluster.sh up failed for cluster {name!r}:\n{out.stderr[-4000:]}")
        match = re.search(r"export KUBECONFIG=(\S+)", out.stdout)
        if not match:
            raise RuntimeError(f"hack/cluster.sh printed no KUBECONFIG:\n{out.stdout}")
        home = Path(os.environ.get("GRPO_CLUSTER_HOME", Path.home() / ".cache" / "grpo-cluster"))
        kubectl = _testbins() / f"k8s-{_version('K8S_VERSION')}" / "kubectl"
        cluster = cls(name, Path(match.group(1)), str(kubectl), home)
        cluster.check_nodes(gpu_nodes)
        cluster.widen_service_range()
        return cluster

    def widen_service_range(self) -> None:
        """The local API server allocates ClusterIPs from 10.0.0.0/24 (254 addresses); 300 jobs need 600
        (vLLM and metric Services; the trainer Service is headless). A second ServiceCIDR, as an admin
        of a real cluster would add, makes room without restarting anything."""
        cidr = {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "ServiceCIDR",
            "metadata": {"name": "grpo-bench"},
            "spec": {"cidrs": ["10.96.0.0/16"]},
        }
        self.kubectl("apply", "-f", "-", input=json.dumps(cidr))

    def check_nodes(self, gpu_nodes: int) -> None:
        nodes = self.get_list("nodes")
        gpu = [n for n in nodes if "nvidia.com/gpu" in (n.get("status") or {}).get("allocatable", {})]
        if len(gpu) < gpu_nodes:
            raise RuntimeError(
                f"cluster {self.name!r} has {len(gpu)} GPU nodes, the benchmark needs {gpu_nodes}: "
                f"remove it (GRPO_CLUSTER_NAME={self.name} bash hack/cluster.sh down) and rerun"
            )

    @property
    def state(self) -> Path:
        return self.home / "clusters" / self.name

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [self.kubectl_bin, "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and out.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {out.stderr.strip()[-2000:]}")
        return out

    def get_list(
        self,
        resource: str,
        namespace: str | None = None,
        selector: str | None = None,
        managed_fields: bool = False,
    ) -> list[Obj]:
        args = ["get", resource, "-o", "json"] + (["--show-managed-fields"] if managed_fields else [])
        args += ["-n", namespace] if namespace else ["-A"]
        if selector:
            args += ["-l", selector]
        return list(json.loads(self.kubectl(*args).stdout)["items"])

    def api(self) -> client.ApiClient:
        configuration = client.Configuration()
        config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=configuration)
        configuration.connection_pool_maxsize = 8
        return client.ApiClient(configuration)

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        return parse_prometheus(self.kubectl("get", "--raw", "/metrics", timeout=60).stdout)

    def kwokctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """kwokctl for this cluster (``start cluster`` starts exactly the components that are not running,
        as a kubelet restarts static control-plane pods)."""
        kwok = _testbins() / f"kwok-{_version('KWOK_VERSION')}" / "kwokctl"
        env = {
            **os.environ,
            "KWOK_WORKDIR": str(self.home),
            "PATH": f"{Path(self.kubectl_bin).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        out = subprocess.run(
            [str(kwok), "--name", self.name, *args], env=env, capture_output=True, text=True, check=False
        )
        if check and out.returncode != 0:
            raise RuntimeError(f"kwokctl {' '.join(args)} failed: {out.stderr.strip()[-2000:]}")
        return out

    def component_pids(self) -> dict[str, int | None]:
        """Control-plane components and their pids (None: not running)."""
        out: dict[str, int | None] = {}
        for pid_file in sorted((self.state / "pids").glob("*.pid")):
            pid = int(pid_file.read_text().strip() or 0)
            try:
                os.kill(pid, 0)
                out[pid_file.stem] = pid
            except OSError:
                out[pid_file.stem] = None
        return out

    def apiserver_pid(self) -> int:
        return int((self.state / "pids" / "kube-apiserver.pid").read_text().strip())


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        labels = frozenset(_LABEL.findall(match.group(2) or ""))
        try:
            samples[(match.group(1), labels)] = float(match.group(3))
        except ValueError:
            continue
    return samples


def metric_sum(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def metric_by(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, label: str
) -> dict[str, float]:
    out: dict[str, float] = {}
    for (n, ls), v in samples.items():
        if n == name:
            key = dict(ls).get(label, "")
            out[key] = out.get(key, 0.0) + v
    return out


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
    path = cluster.home / f"{cluster.name}.operator.kubeconfig"
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


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far (/proc/stat)."""
    parts = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = parts[3] + parts[4]
    total = sum(parts[:8])
    return (total - idle) / ticks, total / ticks


# --- watching ---------------------------------------------------------------------------------------------------


class Informer(threading.Thread):
    """List+watch of one resource across all namespaces; keeps the objects and when each was first seen.

    ``on_event(type, obj, t)`` runs in this thread for every change, with the monotonic time the event
    arrived."""

    def __init__(
        self,
        api: client.ApiClient,
        list_fn: Callable[..., Any],
        on_event: Callable[[str, Obj, float], None] | None = None,
        **list_kwargs: Any,
    ) -> None:
        super().__init__(daemon=True)
        self.api = api
        self.list_fn = list_fn
        self.list_kwargs = list_kwargs
        self.on_event = on_event
        self.objects: dict[tuple[str, str], Obj] = {}
        self.first_seen: dict[tuple[str, str], float] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self.synced = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def _handle(self, type_: str, obj: Obj, t: float) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name")))
        with self.lock:
            if type_ == "DELETED":
                self.objects.pop(key, None)
            else:
                self.objects[key] = obj
                self.first_seen.setdefault(key, t)
        if self.on_event is not None:
            self.on_event(type_, obj, t)

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                listing = self.list_fn(_preload_content=False, **self.list_kwargs)
                data = json.loads(listing.data)
                now = time.monotonic()
                seen = set()
                for item in data.get("items") or []:
                    self._handle("ADDED", item, now)
                    meta = item["metadata"]
                    seen.add((str(meta.get("namespace") or ""), str(meta["name"])))
                with self.lock:
                    gone = [k for k in self.objects if k not in seen]
                for key in gone:
                    self._handle("DELETED", {"metadata": {"namespace": key[0], "name": key[1]}}, now)
                self.synced.set()
                rv = data["metadata"]["resourceVersion"]
                stream = watch.Watch().stream(
                    self.list_fn,
                    resource_version=rv,
                    timeout_seconds=60,
                    allow_watch_bookmarks=False,
                    _request_timeout=90,
                    **self.list_kwargs,
                )
                for event in stream:
                    if self._stop.is_set():
                        return
                    raw = event.get("raw_object") or {}
                    if event["type"] == "ERROR":
                        break
                    self._handle(event["type"], raw, time.monotonic())
            except ApiException as exc:
                if exc.status != 410:
                    time.sleep(1)
            except Exception:  # API server down (chaos) or a dropped stream: list again shortly
                time.sleep(1)

    def snapshot(self) -> list[Obj]:
        with self.lock:
            return list(self.objects.values())


def job_informer(
    api: client.ApiClient, on_event: Callable[[str, Obj, float], None] | None = None
) -> Informer:
    custom = client.CustomObjectsApi(api)

    def list_jobs(**kwargs: Any) -> Any:
        return custom.list_cluster_custom_object("grpo.dev", "v1alpha1", "grpojobs", **kwargs)

    return Informer(api, list_jobs, on_event)


def pod_informer(
    api: client.ApiClient, on_event: Callable[[str, Obj, float], None] | None = None
) -> Informer:
    core = client.CoreV1Api(api)
    return Informer(api, core.list_pod_for_all_namespaces, on_event, label_selector=LABEL_JOB)


# --- the job mix ------------------------------------------------------------------------------------------------

# Per 10 jobs: 6 small (1 vLLM GPU + 1 trainer GPU), 2 medium (1 + 1x2), 1 multi-node (1 + 2 pods x 1)
# and 1 that can never run: alternately a trainer asking for more memory than any node has, and a
# GPU model no node carries. The runnable ones need at most 22 GPUs per 10 jobs (660 of 800 at 300
# jobs) and no pod needs more than 2 GPUs, so whatever the scheduler's spreading, every runnable pod
# finds a node (a 2-GPU pod fails only if all 100 nodes have 7+ GPUs taken, i.e. 700+ in use).
MIX = ("small", "small", "medium", "small", "multi", "small", "medium", "small", "unfit", "small")


def job_kind(index: int) -> str:
    kind = MIX[index % len(MIX)]
    if kind == "unfit":
        return "too-big" if (index // len(MIX)) % 2 == 0 else "no-such-gpu"
    return kind


def job_manifest(name: str, namespace: str, kind: str) -> Obj:
    spec: Obj = {
        "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
        "dataset": {"train": "hf://openai/gsm8k:main#train"},
        "grpo": {"groupSize": 4, "promptsPerStep": 2, "steps": 10},
        "metric": {"image": "ghcr.io/grpo-operator/metric-math:0.1.0"},
        "generation": {"gpus": 1},
        "trainer": {"nodes": 1, "gpusPerNode": 1},
        "checkpoints": {"volume": {"size": "1Gi"}},
    }
    if kind == "medium":
        spec["trainer"] = {"nodes": 1, "gpusPerNode": 2}
    elif kind == "multi":
        spec["trainer"] = {"nodes": 2, "gpusPerNode": 1}
        spec["checkpoints"] = {"volume": {"size": "1Gi", "accessMode": "ReadWriteMany"}}
    elif kind == "too-big":
        spec["trainer"] = {"nodes": 1, "gpusPerNode": 1, "resources": {"requests": {"memory": "4Ti"}}}
    elif kind == "no-such-gpu":
        spec["scheduling"] = {"gpuNodeSelector": {"nvidia.com/gpu.product": "NVIDIA-B300-SXM6-AC"}}
    return {
        "apiVersion": "grpo.dev/v1alpha1",
        "kind": "GRPOJob",
        "metadata": {"name": name, "namespace": namespace, "labels": {"grpo.dev/bench-kind": kind}},
        "spec": spec,
    }


def schedulable(kind: str) -> bool:
    return kind not in ("too-big", "no-such-gpu")


def bench_jobs(count: int, namespaces: list[str], prefix: str = "j") -> list[Obj]:
    return [
        job_manifest(f"{prefix}{i:03d}", namespaces[i % len(namespaces)], job_kind(i)) for i in range(count)
    ]


def gang_size(manifest: Obj) -> int:
    return 1 + int(manifest["spec"]["trainer"].get("nodes", 1))


def children_of(manifest: Obj) -> list[Obj]:
    """What the operator creates for this job at the first attempt, by the operator's own builders,
    without owner references (the floor creates them with no GRPOJob behind them)."""
    from grpo_operator.builders import gang_pods, infrastructure, job_from_object, metric_workload
    from grpo_operator.settings import OperatorSettings

    settings = OperatorSettings()
    obj = {"metadata": {**manifest["metadata"], "uid": ""}, "spec": manifest["spec"]}
    job = job_from_object(obj)
    out = [*infrastructure(job, settings), *metric_workload(job, settings), *gang_pods(job, settings, 1, "")]
    for child in out:
        child["metadata"].pop("ownerReferences", None)
    return out


# --- cleaning up ------------------------------------------------------------------------------------------------


def write_list(items: list[Obj]) -> str:
    """A temporary file with the objects as one JSON v1 List, for kubectl -f. JSON, not YAML: PyYAML
    writes a string like 8e5 unquoted, and kubectl's YAML 1.2 parser reads it back as a number."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump({"apiVersion": "v1", "kind": "List", "items": items}, handle)
        return handle.name


def create_namespaces(cluster: BenchCluster, namespaces: Iterable[str]) -> None:
    docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in namespaces]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))


def delete_namespaces(
    cluster: BenchCluster, namespaces: Iterable[str], timeout: float = 600, wait: bool = False
) -> None:
    """Deletes the namespaces; waits for them only if asked (the namespace controller finalizes with
    backoff, minutes on a busy machine; the benchmarks wait for the pods instead, which is what frees
    the GPUs)."""
    names = list(namespaces)
    if not names:
        return
    cluster.kubectl("delete", "namespace", *names, "--ignore-not-found", "--wait=false")
    if not wait:
        return

    def gone() -> bool:
        out = cluster.kubectl("get", "namespaces", "-o", "name").stdout.split()
        return not any(f"namespace/{n}" in out for n in names)

    wait_for(f"namespaces {', '.join(names)} to be deleted", gone, timeout=timeout, interval=2)


def settle(cluster: BenchCluster, namespaces: Iterable[str], timeout: float = 1200) -> float:
    """Waits until what a phase left behind is gone: its namespaces (so every object in them) and the
    volumes of their claims. The next phase must not share kube-controller-manager with this one's
    clean-up: its garbage collector, namespace controller and PV controller share one client limited to
    20 requests a second, and the PV controller's binding of the next phase's claims queues behind the
    deletions (at 300 jobs, minutes). Returns the seconds waited."""
    names = set(namespaces)
    t0 = time.monotonic()
    delete_namespaces(cluster, names, timeout=timeout, wait=True)

    def volumes_gone() -> bool:
        volumes = cluster.get_list("persistentvolumes")
        return not any(
            ((v.get("spec") or {}).get("claimRef") or {}).get("namespace") in names for v in volumes
        )

    wait_for("their volumes to be deleted", volumes_gone, timeout=timeout, interval=2)
    return time.monotonic() - t0


def gpu_pods(cluster: BenchCluster) -> int:
    """Pods of GRPOJobs (or of the floor) still in the cluster: trainer, vLLM and metric pods."""
    out = cluster.kubectl("get", "pods", "-A", "-l", LABEL_JOB, "-o", "name").stdout
    return len(out.split())


@dataclass
class Ramp:
    """Times of one ramp: each job's (or floor group's) start and the moment it was fully Running."""

    started: dict[str, float] = field(default_factory=dict)
    running: dict[str, float] = field(default_factory=dict)

    def durations(self) -> list[float]:
        return [self.running[k] - self.started[k] for k in self.running if k in self.started]


def chunks(items: list[Obj], size: int) -> Iterator[list[Obj]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
