"""The GPU check's broadcast to two vLLM replicas (bench/gpu_check.py ``served_weights_broadcast_2``):
weightSync Broadcast with replica 0 on GPU 0, replica 1 on GPU 1 and the trainer on GPU 2, so the project's
group (grpo_weight_broadcast) runs over NCCL with three devices, as on a cluster. The generation python
must carry the project's vLLM plugin (the vLLM image does; here: hack/vllm-plugin.sh's directory, which
the harness's vllm_server.start (tests/harness/vllm_server.py) puts on its PYTHONPATH). Reported: every sync in sync on both replicas, its
median duration and bytes (the model once, whatever the number of replicas)."""

from __future__ import annotations

import json
import sys
from typing import Any

from bench._gpu_training import median
from tests.harness.ports import free_port
from tests.trainer.toy import read_jsonl

BROADCAST_GPUS = 3
STEPS = 3


def served_weights_broadcast_2(checker: Any) -> dict[str, Any]:
    from tests.harness import vllm_server

    workdir, config = checker.config("served_broadcast_2", steps=STEPS, every_steps=STEPS)
    container = vllm_server.rendered_container(
        str(checker.model), weightSync="Broadcast", replicas=2, gpuMemoryUtilization=0.9
    )
    # On the CPU smoke both servers run vLLM's CPU build and the group is gloo.
    python = sys.executable if checker.cuda else None
    servers = []
    try:
        for replica in (0, 1):
            env = {**vllm_server.container_env(container), "HF_HOME": str(workdir / f"hf-{replica}")}
            if checker.cuda:
                env["CUDA_VISIBLE_DEVICES"] = str(replica)
            log = workdir / f"vllm-{replica}.log"
            servers.append(vllm_server.start(container, env, free_port(), log, python=python))
        startup = max(server.wait_healthy(checker.sizes.timeout_seconds) for server in servers)
        raw = json.loads(config.read_text())
        raw["generation"] = {
            "backend": "vllm-server",
            "serverHost": "127.0.0.1",
            "serverPort": servers[0].port,
            "serverUrls": [server.base_url for server in servers],
            "startupTimeoutSeconds": 60,
            "weightSync": "broadcast",
            "weightSyncPort": free_port(),
        }
        config.write_text(json.dumps(raw, indent=2))
        run = checker.run(workdir, config, **({"CUDA_VISIBLE_DEVICES": "2"} if checker.cuda else {}))
    finally:
        for server in servers:
            server.stop()
    syncs = read_jsonl(workdir / "out" / "weight_syncs.jsonl")
    out: dict[str, Any] = {
        "exit_code": run.code,
        "vllm_startup_seconds": round(startup, 1) if servers else None,
        "syncs": len(syncs),
        "median_sync_seconds": median([s["seconds"] for s in syncs]),
        "bytes_per_sync": median([s["bytes"] for s in syncs if "bytes" in s]),
        "largest_logprob_diff": max(
            (max(s["replicas"]["logprob_diff"].values(), default=0.0) for s in syncs), default=None
        ),
    }
    out["ok"] = (
        run.code == 0
        and len(syncs) >= STEPS
        and all(s.get("in_sync") and s["replicas"]["serving"] == [0, 1] for s in syncs)
    )
    if not out["ok"]:
        out["log_tail"] = run.log_tail
        out["vllm_log_tail"] = [server.log_tail(20) for server in servers]
    return out
