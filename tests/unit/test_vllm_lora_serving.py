"""The vLLM flags and environment that let a LoRA job sync its adapter alone (builders/vllm_lora.py)."""

from __future__ import annotations

from typing import Any

import pytest
from grpo_operator.builders import gang_pods, job_from_object

from tests.unit.reconcile_world import SETTINGS, job_object


def vllm_container(lora: dict[str, Any] | None, **generation: Any) -> dict[str, Any]:
    grpo: dict[str, Any] = {"lora": lora} if lora is not None else {}
    job = job_from_object(job_object(generation=generation, grpo=grpo))
    pod = next(
        p for p in gang_pods(job, SETTINGS, 1, "") if p["metadata"]["labels"]["grpo.dev/role"] == "generation"
    )
    return dict(pod["spec"]["containers"][0])


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v.get("value", "") for v in container["env"]}


def test_a_lora_job_syncing_through_the_volume_gets_a_vllm_that_loads_adapters_at_runtime() -> None:
    container = vllm_container({"enabled": True, "r": 16}, weightSync="Volume")
    args = container["args"]
    assert args[args.index("--enable-lora") :] == [
        "--enable-lora",
        "--max-lora-rank",
        "16",
        "--max-loras",
        "2",
    ]
    assert env_of(container)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


@pytest.mark.parametrize(
    ("r", "rank"), [(1, "1"), (2, "8"), (8, "8"), (33, "64"), (300, "320"), (512, "512")]
)
def test_the_max_lora_rank_is_the_smallest_vllm_accepts_above_the_adapters(r: int, rank: str) -> None:
    args = vllm_container({"enabled": True, "r": r}, weightSync="Volume")["args"]
    assert args[args.index("--max-lora-rank") + 1] == rank


@pytest.mark.parametrize(
    ("lora", "generation"),
    [
        (None, {"weightSync": "Volume"}),  # full fine-tuning
        ({"enabled": True, "r": 16}, {}),  # NCCL (the default transport) pushes the merged model
        ({"enabled": True, "r": 513}, {"weightSync": "Volume"}),  # above vLLM's largest rank
    ],
)
def test_other_jobs_get_the_server_they_had(lora: dict[str, Any] | None, generation: dict[str, Any]) -> None:
    container = vllm_container(lora, **generation)
    assert "--enable-lora" not in container["args"]
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in env_of(container)
    assert container == vllm_container(None, **generation)


def test_a_job_can_turn_runtime_adapter_loading_off_and_keeps_merged_sync() -> None:
    container = vllm_container(
        {"enabled": True, "r": 16},
        weightSync="Volume",
        env=[{"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "False"}],
    )
    assert env_of(container)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "False"
