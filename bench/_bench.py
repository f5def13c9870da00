"""Shared machinery of the benchmarks (bench/scale.py, bench/chaos.py, bench/tenant_memory.py).

Here: logging, waiting and percentiles; ``BenchCluster``, the local control plane (hack/cluster.sh) under
its own name, kubectl, the API server's /metrics and its component processes (for the chaos scripts);
creating and clearing the namespaces of a phase. Beside it:

* bench/_operator_under_test.py: the operator's identity (its own ServiceAccount and API Priority and
  Fairness flow, which the API server counts), ``grpo-operator run`` as a subprocess with its CPU seconds
  and peak RSS, and the operator's own /metrics.
* bench/_informers.py: list+watch of one resource in a thread, keeping the latest objects and the time
  each was first seen.
* bench/_job_mix.py: the job mix: sizes that fit, and sizes and placements that can never fit the
  simulated nodes.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

REPO = Path(__file__).resolve().parents[1]
HACK = REPO / "hack"
Obj = dict[str, Any]

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
            # kwok's own stages: every pod Ready once scheduled. The test cluster's stages leave a vLLM pod
            # not Ready until a vLLM server answers, and no vLLM runs here: what is measured is the
            # operator's cost, with the figures comparable to earlier runs.
            "GRPO_KWOK_STAGES": "",
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


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far (/proc/stat)."""
    parts = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = parts[3] + parts[4]
    total = sum(parts[:8])
    return (total - idle) / ticks, total / ticks


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
