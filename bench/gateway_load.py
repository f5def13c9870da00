"""The rollout gateway under large bodies: its RSS and its /healthz latency.

Starts ``python -m grpo_gateway`` as its Deployment does (a gateway.json for G=8 and the spec's default
lengths, rendered by the operator's builder) and measures:

1. RSS before and after ``--count`` large JSON bodies (``--mib`` each, a list of small objects: JSON that
   grows most when parsed) posted one after the other to Arbor's status route, which a client reaches
   without a token when the job names none;
2. the same for bodies just under the step route's limit (one group), the largest the gateway reads;
3. /healthz latency (max and median of polls every 50 ms) while ``--concurrent`` such step bodies are
   sent at once, and the RSS after them.

Run: ``.venv/bin/python -m bench.gateway_load [--count 4 --mib 64 --concurrent 8]``. ``--source DIR``
runs the gateway from another checkout (e.g. ``git worktree`` of the previous commit) to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests
from grpo_operator.builders import job_from_object
from grpo_operator.builders.trainer_configmap import gateway_config

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run by path: `python bench/gateway_load.py`
    sys.path.insert(0, str(REPO))

from tests.harness.ports import free_port  # noqa: E402

MIB = 1024 * 1024
NEW_KEYS = {
    "maxAbsReward",
    "maxTranscriptBytes",
    "maxControlBodyBytes",
    "maxCheckpointRequests",
    "maxHeldCompletions",
    "maxHeldCompletionBytes",
}


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """Resident memory now (VmRSS) or its peak since start (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for pid {pid}")


def config_text() -> str:
    manifest = {
        "apiVersion": "grpo.dev/v1alpha1",
        "kind": "GRPOJob",
        "metadata": {"name": "bench", "namespace": "team-a", "uid": "uid-1"},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
            "grpo": {"groupSize": 8, "promptsPerStep": 2, "steps": 10},
            "trainer": {"nodes": 1, "gpusPerNode": 2},
            "rollouts": {"source": "Client"},
        },
    }
    job = job_from_object(manifest)
    config = gateway_config(job).model_copy(update={"client_port": free_port(), "internal_port": free_port()})
    return config.dump_json()


def body_of(size: int) -> bytes:
    """A JSON object of about ``size`` bytes: a list of one-key objects, ~10x its size once parsed."""
    item = b'{"a":[]},'
    count = max(1, (size - 64) // len(item))
    return b'{"job_id":null,"batch_id":1,"batch":[' + item * (count - 1) + b'{"a":[]}]}'


def post(url: str, data: bytes) -> int:
    try:
        return requests.post(
            url, data=data, headers={"Content-Type": "application/json"}, timeout=120
        ).status_code
    except requests.RequestException:
        return -1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=4, help="large bodies sent one after the other")
    parser.add_argument("--mib", type=float, default=64.0, help="size of each of them")
    parser.add_argument("--concurrent", type=int, default=8, help="step-sized bodies sent at once")
    parser.add_argument("--source", type=Path, default=REPO, help="checkout whose gateway is run")
    args = parser.parse_args()

    text = config_text()
    config = json.loads(text)
    client = f"http://127.0.0.1:{config['clientPort']}"
    step_limit = config["groupSize"] * config["maxTranscriptBytes"] + config["maxControlBodyBytes"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gateway.json"
        written = config
        if args.source != REPO:
            # A checkout from before the body limits: its GatewayConfig forbids the keys they added.
            written = {k: v for k, v in config.items() if k not in NEW_KEYS}
        path.write_text(json.dumps(written), encoding="utf-8")
        env = {
            **os.environ,
            "GRPO_GATEWAY_CONFIG": str(path),
            "PYTHONPATH": f"{args.source / 'operator'}:{args.source / 'trainer_image'}",
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "grpo_gateway"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    requests.get(f"{client}/healthz", timeout=1)
                    break
                except requests.ConnectionError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise SystemExit("the gateway did not start") from None
                    time.sleep(0.2)
            idle = rss_mib(proc.pid)
            print(f"gateway RSS idle: {idle:.0f} MiB (step body limit {step_limit / MIB:.2f} MiB)")

            large = body_of(int(args.mib * MIB))
            codes = [post(f"{client}/v1/fine_tuning/grpo/status", large) for _ in range(args.count)]
            print(
                f"{args.count} x {args.mib:g} MiB bodies to /v1/fine_tuning/grpo/status: answers {codes}, "
                f"RSS {idle:.0f} -> {rss_mib(proc.pid):.0f} MiB, peak {rss_mib(proc.pid, 'VmHWM'):.0f} MiB"
            )

            step_body = body_of(step_limit - 1024)
            before = rss_mib(proc.pid)
            codes = [post(f"{client}/v1/fine_tuning/grpo/step", step_body) for _ in range(args.count)]
            print(
                f"{args.count} x {len(step_body) / MIB:.2f} MiB bodies to /v1/fine_tuning/grpo/step: answers "
                f"{codes}, RSS {before:.0f} -> {rss_mib(proc.pid):.0f} MiB, peak {rss_mib(proc.pid, 'VmHWM'):.0f} MiB"
            )

            latencies: list[float] = []
            peak = [rss_mib(proc.pid)]
            done = threading.Event()

            def probe() -> None:
                while not done.is_set():
                    started = time.monotonic()
                    try:
                        requests.get(f"{client}/healthz", timeout=10)
                        latencies.append(time.monotonic() - started)
                    except requests.RequestException:
                        latencies.append(10.0)
                    peak.append(rss_mib(proc.pid))
                    time.sleep(0.05)

            prober = threading.Thread(target=probe, daemon=True)
            prober.start()
            senders = [
                threading.Thread(target=post, args=(f"{client}/v1/fine_tuning/grpo/step", step_body))
                for _ in range(args.concurrent)
            ]
            for sender in senders:
                sender.start()
            for sender in senders:
                sender.join()
            done.set()
            prober.join()
            print(
                f"/healthz while {args.concurrent} step bodies are sent at once: max "
                f"{max(latencies) * 1000:.0f} ms, median {statistics.median(latencies) * 1000:.0f} ms over "
                f"{len(latencies)} polls; RSS peak {rss_mib(proc.pid, 'VmHWM'):.0f} MiB, after {rss_mib(proc.pid):.0f} MiB"
            )
        finally:
            proc.terminate()
            proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
