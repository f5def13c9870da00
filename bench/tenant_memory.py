"""The operator's memory under tenant load: many big ConfigMaps that carry a job's label.

A tenant can label any object in their namespace ``grpo.dev/job=<job>``. The operator's caches must not
grow with such objects: they keep only what the operator manages, and ConfigMaps are watched as metadata
(their data never reaches the operator). This script runs the operator against the local cluster, creates
one GRPOJob, then ``--count`` ConfigMaps of ``--size-mib`` MiB each labelled with that job, and prints the
operator's resident memory (VmRSS) before and after, and its peak (VmHWM).

    .venv/bin/python bench/tenant_memory.py                       # 1000 x 1 MiB
    .venv/bin/python bench/tenant_memory.py --count 200 --source /path/to/older/checkout

``--source`` runs the operator from another checkout's ``operator/`` folder (a before/after comparison on
one machine). The cluster (``--cluster``, default grpo-memory) stays up; remove it with
``GRPO_CLUSTER_NAME=grpo-memory bash hack/cluster.sh down``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _bench import BenchCluster, log, wait_for
from _operator_under_test import OperatorProcess, operator_identity
from kubernetes import client

MIB = 1024 * 1024


def rss(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in bytes."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) * 1024
    return values["VmRSS"], values["VmHWM"]


def settle(pid: int, seconds: float) -> int:
    """VmRSS after it stopped changing by more than 1 MiB for ``seconds`` (or 3 x ``seconds`` passed)."""
    deadline = time.monotonic() + 3 * seconds
    last, since = rss(pid)[0], time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = rss(pid)[0]
        if abs(now - last) > MIB:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= seconds:
            break
    return rss(pid)[0]


def job_manifest(name: str) -> dict[str, object]:
    return {
        "apiVersion": "grpo.dev/v1alpha1",
        "kind": "GRPOJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
            "dataset": {"train": "hf://openai/gsm8k:main#train"},
            "grpo": {"groupSize": 4, "promptsPerStep": 1, "steps": 10},
            "metric": {"image": "ghcr.io/grpo-operator/metric-math:0.1.0"},
            "trainer": {"nodes": 1, "gpusPerNode": 1},
            "checkpoints": {"volume": {"size": "1Gi"}},
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=1000, help="ConfigMaps to create (default 1000)")
    parser.add_argument("--size-mib", type=float, default=1.0, help="data per ConfigMap in MiB (default 1)")
    parser.add_argument("--cluster", default="grpo-memory")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds RSS must stay flat (default 15)")
    parser.add_argument(
        "--managed-by",
        action="store_true",
        help="also give the ConfigMaps the operator's own label app.kubernetes.io/managed-by=grpo-operator",
    )
    parser.add_argument("--source", type=Path, help="run the operator from this checkout's operator/ folder")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()

    cluster = BenchCluster.up(args.cluster, gpu_nodes=1, cpu_nodes=1)
    kubeconfig = operator_identity(cluster)
    namespace = f"mem-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    for crd in sorted((Path(__file__).resolve().parents[1] / "crds").glob("*.yaml")):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
    workdir = Path(tempfile.mkdtemp(prefix="grpo-memory-"))
    op = OperatorProcess(kubeconfig, workdir / "operator.log", source=args.source)
    op.start()
    try:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job_manifest("math")))
        wait_for(
            "the job's children",
            lambda: (
                cluster.kubectl("get", "configmap", "math-config", "-n", namespace, check=False).returncode
                == 0
            ),
            timeout=120,
        )
        before = settle(op.pid, args.settle)
        log(f"operator RSS before: {before / MIB:.1f} MiB")

        payload = "x" * int(args.size_mib * MIB - 4096)  # room for the object's metadata within 1 MiB
        core = client.CoreV1Api(cluster.api())
        labels = {"grpo.dev/job": "math"}
        if args.managed_by:
            labels["app.kubernetes.io/managed-by"] = "grpo-operator"

        def create(i: int) -> None:
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"tenant-{i:05d}", "labels": labels},
                "data": {"blob": payload},
            }
            core.create_namespaced_config_map(namespace, body)

        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(create, range(args.count)))
        log(f"created {args.count} ConfigMaps of {args.size_mib:g} MiB in {time.monotonic() - started:.0f}s")
        after = settle(op.pid, args.settle)
        peak = rss(op.pid)[1]
        figures = {
            "count": args.count,
            "size_mib": args.size_mib,
            "labels": labels,
            "rss_before_mib": round(before / MIB, 1),
            "rss_after_mib": round(after / MIB, 1),
            "rss_growth_mib": round((after - before) / MIB, 1),
            "peak_rss_mib": round(peak / MIB, 1),
            "source": str(args.source) if args.source else "installed",
        }
        print(json.dumps(figures, indent=2))
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2))
    finally:
        op.stop()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
