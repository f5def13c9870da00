"""The GPU check's asynchronous-GRPO comparison (bench/gpu_check.py ``async_overlap``): the same job at
maxStaleness 0 and 1 against one vLLM server on GPU 0 while the trainer trains on GPU 1, the split a
cluster gives generation and training pods. bench/async_overlap.py is the same comparison on two pinned
CPU cores. Reported per η: steps per second over steps 2..S, the share of each step in which sampling
overlapped training, the trainer's wait for groups and for the push, and the reward at the end."""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

from tests.harness.ports import free_port

STEPS = 12
COMPLETION_TOKENS = 128


def async_overlap(checker: Any) -> dict[str, Any]:
    from tests.harness import vllm_server

    container = vllm_server.rendered_container(
        str(checker.model), weightSync="Volume", gpuMemoryUtilization=0.9
    )
    home = checker.work / "async_server"
    env = {**vllm_server.container_env(container), "HF_HOME": str(home / "hf"), "CUDA_VISIBLE_DEVICES": "0"}
    server = vllm_server.start(container, env, free_port(), home / "vllm.log", python=sys.executable)
    out: dict[str, Any] = {}
    try:
        out["vllm_startup_seconds"] = round(server.wait_healthy(checker.sizes.timeout_seconds), 1)
        for eta in (0, 1):
            workdir, config = checker.config(
                f"async_eta{eta}",
                steps=STEPS,
                every_steps=STEPS,
                completion_tokens=COMPLETION_TOKENS,
                learning_rate=1e-5,
            )
            raw = json.loads(config.read_text())
            raw["grpo"]["maxStaleness"] = eta
            raw["generation"] = {
                "backend": "vllm-server",
                "serverHost": "127.0.0.1",
                "serverPort": server.port,
                "weightSync": "volume",
                "weightSyncDir": str(workdir / "weight-sync"),
            }
            config.write_text(json.dumps(raw, indent=2))
            run = checker.run(workdir, config, CUDA_VISIBLE_DEVICES="1")
            out[f"eta{eta}"] = summary(run.code, run.records)
            if run.code != 0:
                out[f"eta{eta}"]["log_tail"] = run.log_tail
    finally:
        server.stop()
    ran = [out.get(f"eta{eta}", {}) for eta in (0, 1)]
    out["ok"] = all(r.get("exit_code") == 0 and r.get("steps") == STEPS for r in ran)
    if out["ok"]:
        out["speedup_eta1"] = round(ran[1]["steps_per_second"] / ran[0]["steps_per_second"], 2)
    else:
        out["vllm_log_tail"] = server.log_tail(20)
    return out


def summary(code: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    later = rows[1:] or rows
    if not later:
        return {"exit_code": code, "steps": 0}
    return {
        "exit_code": code,
        "steps": len(rows),
        "steps_per_second": round(len(later) / sum(r["step_seconds"] for r in later), 3),
        "overlap_ratio": statistics.median(r.get("generation_overlap_ratio", 0.0) for r in later),
        "rollout_wait_seconds": statistics.median(r.get("rollout_wait_seconds", 0.0) for r in later),
        "push_wait_seconds": statistics.median(r.get("push_wait_seconds", 0.0) for r in later),
        "staleness_max": max((r.get("staleness", 0) for r in rows), default=0),
        "reward_first3": statistics.mean(r["reward_mean"] for r in rows[:3]),
        "reward_last3": statistics.mean(r["reward_mean"] for r in rows[-3:]),
    }
