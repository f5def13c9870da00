"""The benchmarks' GRPOJobs: a mix of sizes that fit, and sizes and placements that never fit the
simulated nodes, and the children the operator's own builders make for each."""

from __future__ import annotations

from _bench import Obj

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
