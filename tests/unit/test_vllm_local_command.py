"""The local cluster runs the vLLM container the operator renders, changed only where the CPU or the
machine needs it: this compares the process's command line and environment with the pod spec."""

from __future__ import annotations

from pathlib import Path

import pytest
from grpo_operator.builders.gang import VLLM_SUPERVISOR

from tests.harness import vllm_server

LOCAL_LOG = Path("/tmp/run/tiny-gen-1-0.termination-log")


@pytest.mark.parametrize("weight_sync", ["Volume", "NCCL"])
def test_the_local_vllm_runs_the_rendered_args_and_env_with_only_the_cpu_changes(weight_sync: str) -> None:
    container = vllm_server.rendered_container("/models/tiny", weightSync=weight_sync, maxModelLen=256)
    env = vllm_server.container_env(container)
    command, local_env = vllm_server.local_command(container, env, "/venv/bin/python", 45678, LOCAL_LOG)

    # The pod: `vllm serve <args>` under the supervisor, which writes where the kubelet reads and (the
    # job's volume being ReadWriteMany) keeps vLLM's log on the volume.
    kept = ["--keep-log", "/workspace/output/logs/attempt-1/vllm-0.log"]
    assert container["command"] == [
        "python3",
        "-c",
        VLLM_SUPERVISOR,
        "--termination-log",
        "/dev/termination-log",
        *kept,
        "--",
        "vllm",
        "serve",
    ]
    assert container["terminationMessagePath"] == "/dev/termination-log"
    # Here: the same supervisor source under vLLM's python, writing to a file of the run's.
    supervisor = command[: command.index("--") + 1]
    assert supervisor == [
        "/venv/bin/python",
        "-c",
        container["command"][2],
        "--termination-log",
        str(LOCAL_LOG),
        *kept,
        "--",
    ]
    server = command[len(supervisor) :]
    assert server[:5] == [
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/tiny",
    ]
    rendered = container["args"][1:]
    local = server[5:]
    # Every rendered flag and value, in order; only the listening address differs.
    expected = list(rendered)
    expected[expected.index("--host") + 1] = "127.0.0.1"
    expected[expected.index("--port") + 1] = "45678"
    assert local == expected
    assert ("--weight-transfer-config" in local) == (weight_sync == "NCCL")
    assert local[local.index("--max-model-len") + 1] == "256"

    # The container's environment unchanged, plus the CPU build's settings: the KV cache, the compile
    # cache, unpinned OpenMP threads, and the one-GPU server's worker inside the engine core (the GPU
    # image's process shape).
    added = {k: v for k, v in local_env.items() if k not in env}
    assert {k: local_env[k] for k in env} == env
    assert set(added) == {
        "VLLM_CPU_KVCACHE_SPACE",
        "VLLM_CACHE_ROOT",
        "VLLM_CPU_OMP_THREADS_BIND",
        "VLLM_ENABLE_V1_MULTIPROCESSING",
    }
    assert added["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["VLLM_SERVER_DEV_MODE"] == "1"


@pytest.mark.parametrize(
    "command",
    [
        ["vllm", "serve"],
        ["python", "serve.py"],
        # The supervisor writing somewhere else than where the kubelet reads.
        ["python3", "-c", VLLM_SUPERVISOR, "--termination-log", "/tmp/log", "--", "vllm", "serve"],
    ],
)
def test_a_container_with_another_command_is_refused(command: list[str]) -> None:
    container = {**vllm_server.rendered_container("/models/tiny"), "command": command}
    with pytest.raises(
        ValueError,
        match="expected python3 -c <supervisor> --termination-log /dev/termination-log -- vllm serve",
    ):
        vllm_server.local_command(container, {}, "/venv/bin/python", 1, LOCAL_LOG)
