"""The data plane between the pods of a job: the ports and settings the operator puts on pods and
Services must be the ones the trainer is told about, whatever the operator's settings say."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from grpo_operator.api import TrainerConfig
from grpo_operator.builders import gang_pods, infrastructure, metric_workload
from grpo_operator.builders.gang import generation_service, trainer_service
from grpo_operator.settings import DATA_PLANE, OperatorSettings, SettingsError

from tests.unit.test_builders import env_of, make_job

# Every data-plane port moved off its default (and off every other default), as a platform might.
MOVED_PORTS = OperatorSettings(
    vllm_port=8100, weight_sync_port=52000, trainer_metrics_port=9400, master_port=29600
)


def _config(settings: OperatorSettings) -> tuple[TrainerConfig, dict[str, Any]]:
    (config_map,) = [m for m in infrastructure(make_job(), settings) if m["kind"] == "ConfigMap"]
    text = config_map["data"]["trainer.json"]
    return TrainerConfig.model_validate_json(text), json.loads(text)


def _port(container: dict[str, Any], name: str) -> int:
    return int(next(p["containerPort"] for p in container["ports"] if p["name"] == name))


def test_non_default_ports_reach_the_trainer_config_pods_and_services() -> None:
    job = make_job()
    config, _ = _config(MOVED_PORTS)
    vllm, rank0 = gang_pods(job, MOVED_PORTS, 1, "")
    (vllm_container,) = vllm["spec"]["containers"]
    (trainer_container,) = rank0["spec"]["containers"]
    args = vllm_container["args"]

    # What vLLM listens on and what the trainer connects to are the same port.
    assert args[args.index("--port") + 1] == "8100"
    assert _port(vllm_container, "http") == 8100
    assert generation_service(job, MOVED_PORTS)["spec"]["ports"][0]["port"] == 8100
    assert config.generation.server_port == 8100
    assert env_of(rank0)["GRPO_VLLM_URL"] == "http://math-gen.team-a.svc:8100"

    # What rank 0 binds (TRL's vllm_group_port and /metrics) is what its pod and Service publish.
    assert config.generation.weight_sync_port == _port(trainer_container, "weight-sync") == 52000
    assert config.metrics_port == _port(trainer_container, "metrics") == 9400
    assert rank0["metadata"]["annotations"]["prometheus.io/port"] == "9400"
    service_ports = {p["name"]: p["port"] for p in trainer_service(job, MOVED_PORTS)["spec"]["ports"]}
    assert service_ports == {"rendezvous": 29600, "weight-sync": 52000, "metrics": 9400}
    assert env_of(rank0)["MASTER_PORT"] == "29600"


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


DATA_PLANE_SETTINGS = [f for f in dataclasses.fields(OperatorSettings) if f.metadata.get(DATA_PLANE)]


def test_the_ports_are_marked_as_data_plane_settings() -> None:
    assert {f.name for f in DATA_PLANE_SETTINGS} >= {
        "vllm_port",
        "weight_sync_port",
        "trainer_metrics_port",
        "master_port",
    }


@pytest.mark.parametrize("setting", DATA_PLANE_SETTINGS, ids=lambda f: f.name)
def test_every_data_plane_setting_is_rendered_for_the_trainer(setting: dataclasses.Field[Any]) -> None:
    """A setting the trainer must agree on reaches it, as a trainer.json value or an environment
    variable of its own, whenever the operator's value changes."""
    unusual = 41234
    assert getattr(OperatorSettings(), setting.name) != unusual
    changes: dict[str, Any] = {setting.name: unusual}
    settings = dataclasses.replace(OperatorSettings(), **changes)
    _, raw = _config(settings)
    rank0 = gang_pods(make_job(), settings, 1, "")[1]
    seen = [*_leaves(raw), *env_of(rank0).values()]
    assert unusual in seen or str(unusual) in seen, (
        f"OperatorSettings.{setting.name} is a data-plane setting but neither trainer.json nor the trainer's "
        "environment carries its value: render it in builders/trainer_configmap.py or builders/gang.py"
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"vllm_port": 0}, "vllm_port"),
        ({"weight_sync_port": 70000}, "weight_sync_port"),
        ({"trainer_metrics_port": 29500}, "must differ"),
    ],
)
def test_unusable_ports_are_refused_at_start_up(changes: dict[str, int], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        OperatorSettings(**changes)  # type: ignore[arg-type]


def test_ports_from_the_environment_reach_the_trainer_config() -> None:
    settings = OperatorSettings.from_env(
        {"GRPO_OPERATOR_VLLM_PORT": "8200", "GRPO_OPERATOR_TRAINER_METRICS_PORT": "9500"}
    )
    config, _ = _config(settings)
    assert (config.generation.server_port, config.metrics_port) == (8200, 9500)


# --- secrets and private models ------------------------------------------------------------------------

HF_TOKEN = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
WANDB = {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}}
MODE = {
    "name": "MODE",
    "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode", "optional": True}},
}


def _env_list(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return list(pod["spec"]["containers"][0]["env"])


def test_the_model_token_reaches_vllm_and_every_trainer_as_a_secret_reference() -> None:
    job = make_job(
        model={"tokenSecretRef": {"name": "hf-token", "key": "token"}},
        trainer={"nodes": 2, "gpusPerNode": 1},
        checkpoints={"volume": {"accessMode": "ReadWriteMany"}},
    )
    pods = gang_pods(job, OperatorSettings(), 1, "")
    assert len(pods) == 3
    for pod in pods:
        assert HF_TOKEN in _env_list(pod), pod["metadata"]["name"]
    # The metric service (the user's scoring code) gets no model token.
    (deployment,) = metric_workload(job, OperatorSettings())
    assert "HF_TOKEN" not in {
        e["name"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }


def test_without_a_token_no_pod_gets_hf_token() -> None:
    for pod in gang_pods(make_job(), OperatorSettings(), 1, ""):
        assert "HF_TOKEN" not in env_of(pod)


def test_the_token_wins_over_a_plain_hf_token_entry() -> None:
    job = make_job(
        model={"tokenSecretRef": {"name": "hf-token", "key": "token"}},
        trainer={"env": [{"name": "HF_TOKEN", "value": "hf_plaintext"}]},
        generation={"env": [{"name": "HF_TOKEN", "value": "hf_plaintext"}]},
    )
    for pod in gang_pods(job, OperatorSettings(), 1, ""):
        entries = [e for e in _env_list(pod) if e["name"] == "HF_TOKEN"]
        assert entries == [HF_TOKEN]


def test_value_from_env_reaches_trainer_vllm_and_metric_pods_unresolved() -> None:
    job = make_job(
        trainer={"env": [WANDB, MODE, {"name": "EMPTY"}]},
        generation={"env": [WANDB, {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]},
        metric={"env": [WANDB, {"name": "STRICT", "value": "1"}]},
    )
    vllm, trainer = gang_pods(job, OperatorSettings(), 1, "")
    (deployment,) = metric_workload(job, OperatorSettings())
    metric_env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert WANDB in _env_list(trainer) and MODE in _env_list(trainer)
    assert {"name": "EMPTY", "value": ""} in _env_list(trainer)
    assert WANDB in _env_list(vllm) and {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"} in _env_list(vllm)
    assert WANDB in metric_env and {"name": "STRICT", "value": "1"} in metric_env
    # Nothing the operator renders holds a resolved secret: only references.
    rendered = json.dumps([vllm, trainer, deployment, *infrastructure(job, OperatorSettings())])
    assert "api-key" in rendered and '"value": "hf_' not in rendered


def test_users_cannot_turn_off_vllm_dev_mode() -> None:
    job = make_job(generation={"env": [{"name": "VLLM_SERVER_DEV_MODE", "value": "0"}]})
    vllm = gang_pods(job, OperatorSettings(), 1, "")[0]
    assert [e for e in _env_list(vllm) if e["name"] == "VLLM_SERVER_DEV_MODE"] == [
        {"name": "VLLM_SERVER_DEV_MODE", "value": "1"}
    ]


# --- models on the job's volume ------------------------------------------------------------------------


def _claims(pod: dict[str, Any]) -> list[str]:
    return [
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    ]


def _mounts(pod: dict[str, Any]) -> set[str]:
    return {m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}


def test_a_model_on_a_rwx_volume_is_mounted_where_vllm_reads_it() -> None:
    job = make_job(
        model={"name": "/workspace/models/qwen"}, checkpoints={"volume": {"accessMode": "ReadWriteMany"}}
    )
    vllm, trainer = gang_pods(job, OperatorSettings(), 1, "")
    assert vllm["spec"]["containers"][0]["args"][0] == "/workspace/models/qwen"
    assert _claims(vllm) == _claims(trainer) == ["math-ckpt"]
    assert "/workspace" in _mounts(vllm) and "/workspace" in _mounts(trainer)


def test_an_existing_claim_declared_rwx_is_mounted_by_vllm_too() -> None:
    job = make_job(
        model={"name": "/workspace/models/qwen"},
        checkpoints={"volume": {"existingClaim": "team-models", "accessMode": "ReadWriteMany"}},
    )
    vllm, trainer = gang_pods(job, OperatorSettings(), 1, "")
    assert _claims(vllm) == _claims(trainer) == ["team-models"]
    assert "/workspace" in _mounts(vllm)
    # Without the declaration the claim may be ReadWriteOnce: vLLM does not try to attach it.
    rwo = make_job(checkpoints={"volume": {"existingClaim": "team-models"}})
    assert _claims(gang_pods(rwo, OperatorSettings(), 1, "")[0]) == []


# --- the model cache ------------------------------------------------------------------------------------


def test_a_platform_cache_claim_holds_the_hf_cache_of_vllm_and_trainers() -> None:
    settings = OperatorSettings(model_cache_claim="hf-cache")
    vllm, trainer = gang_pods(make_job(), settings, 3, "")
    for pod in (vllm, trainer):
        assert "hf-cache" in _claims(pod), pod["metadata"]["name"]
        assert "/cache" in _mounts(pod)
        assert env_of(pod)["HF_HOME"] == "/cache/huggingface"
        # Nothing in memory or on the pod's own disk: a restarted gang finds the download.
        assert not any("emptyDir" in v and v["name"] == "model-cache" for v in pod["spec"]["volumes"])


def test_without_a_cache_claim_vllm_caches_on_a_rwx_job_volume() -> None:
    rwx = make_job(checkpoints={"volume": {"accessMode": "ReadWriteMany"}})
    vllm, trainer = gang_pods(rwx, OperatorSettings(), 1, "")
    assert env_of(vllm)["HF_HOME"] == env_of(trainer)["HF_HOME"] == "/workspace/hf-cache"
    assert _claims(vllm) == ["math-ckpt"]
    # ReadWriteOnce: vLLM cannot mount the job's volume and falls back to its pod's emptyDir.
    vllm_rwo = gang_pods(make_job(), OperatorSettings(), 1, "")[0]
    assert env_of(vllm_rwo)["HF_HOME"] == "/cache/huggingface"
    assert {"name": "model-cache", "emptyDir": {}} in vllm_rwo["spec"]["volumes"]


def test_a_bad_cache_claim_name_is_refused_at_start_up() -> None:
    with pytest.raises(SettingsError, match="GRPO_OPERATOR_MODEL_CACHE_CLAIM"):
        OperatorSettings.from_env({"GRPO_OPERATOR_MODEL_CACHE_CLAIM": "HF_Cache"})
