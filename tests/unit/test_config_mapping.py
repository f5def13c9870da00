"""B, G, S onto TRL's batch settings for the actual world size; vLLM server mode vs in-process generation.

Pure arithmetic and config mapping (no torch), so it runs under `make test-unit`; only the test that hands
the result to TRL's GRPOConfig needs the [trainer] extra."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from grpo_operator.api.spec import GRPOJobSpec
from grpo_operator.api.trainer_config import TrainerConfig
from grpo_trainer.errors import ConfigError
from grpo_trainer.grpo_config import RuntimeEnv, grpo_config_kwargs, load_config, plan_batches


def spec(**grpo: Any) -> GRPOJobSpec:
    body: dict[str, Any] = {
        "model": {"name": "Qwen/Qwen2.5-1.5B-Instruct"},
        "dataset": {"train": "hf://openai/gsm8k:main#train"},
        "grpo": {"groupSize": 8, "promptsPerStep": 64, "steps": 500, **grpo},
        "metric": {"image": "registry/metric:1"},
        "trainer": {"nodes": 1, "gpusPerNode": 8, "perDeviceBatchSize": 8},
    }
    return GRPOJobSpec.model_validate(body)


def config(backend: str = "vllm-server", **grpo: Any) -> TrainerConfig:
    return TrainerConfig.from_spec(
        "team",
        "math",
        None,
        spec(**grpo),
        metric_url="http://math-metric:8080",
        generation_host="math-gen.team.svc" if backend == "vllm-server" else None,
        backend=backend,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("b", "g", "per_device", "world", "ga"),
    [(64, 8, 8, 8, 8), (4, 8, 2, 2, 8), (2, 4, 8, 1, 1), (3, 4, 2, 2, 3), (1, 2, 1, 1, 2)],
)
def test_batch_plan(b: int, g: int, per_device: int, world: int, ga: int) -> None:
    plan = plan_batches(b, g, per_device, world)
    assert plan.gradient_accumulation_steps == ga
    assert per_device * world * plan.gradient_accumulation_steps == b * g


def test_unmappable_batch_says_what_to_change() -> None:
    with pytest.raises(
        ConfigError, match=r"B\*G = 4\*8 = 32 .*perDeviceBatchSize to one of \[1, 2, 4, 8, 16\]"
    ):
        plan_batches(4, 8, 3, 2)
    with pytest.raises(ConfigError, match=r"B\*G = 3\*2 = 6 .* multiple of the 4 trainer processes"):
        plan_batches(3, 2, 1, 4)
    with pytest.raises(ConfigError, match="at least 2"):
        plan_batches(4, 1, 1, 1)


@pytest.mark.trainer
def test_vllm_server_mode_mapping_is_accepted_by_trl() -> None:
    grpo_config = pytest.importorskip("trl.trainer.grpo_config", reason="needs the [trainer] extra (TRL)")

    c = config()
    plan = plan_batches(64, 8, 8, 8)
    kwargs = grpo_config_kwargs(c, plan, cuda=False)
    assert kwargs["use_vllm"] is True and kwargs["vllm_mode"] == "server"
    assert kwargs["vllm_server_base_url"] == "http://math-gen.team.svc:8000"
    assert kwargs["vllm_group_port"] == 51216
    assert kwargs["num_generations"] == 8 and kwargs["max_steps"] == 500
    assert kwargs["gradient_accumulation_steps"] == 8 and kwargs["per_device_train_batch_size"] == 8
    assert kwargs["output_dir"] == "/workspace/checkpoints/.partial/attempt-0"
    assert (
        grpo_config_kwargs(c, plan, cuda=False, attempt=3)["output_dir"]
        == "/workspace/checkpoints/.partial/attempt-3"
    )
    args = grpo_config.GRPOConfig(**kwargs)
    # TRL derives the generation batch: B*G completions per process group and step.
    assert args.generation_batch_size == 64 * 8 // 8 and args.steps_per_generation == 8


def test_transformers_backend_generates_in_process() -> None:
    kwargs = grpo_config_kwargs(config("transformers"), plan_batches(64, 8, 8, 8), cuda=False)
    assert kwargs["use_vllm"] is False and "vllm_mode" not in kwargs
    # bfloat16 (the default dtype) computes under bf16 autocast on the CPU too, over fp32 master weights.
    assert kwargs["use_cpu"] is True and kwargs["bf16"] is True
    assert kwargs["model_init_kwargs"]["dtype"] == "float32"


def test_vllm_backend_without_host_is_a_config_error() -> None:
    c = config("transformers").model_copy(
        update={"generation": config().generation.model_copy(update={"server_host": None})}
    )
    with pytest.raises(ConfigError, match="serverHost"):
        grpo_config_kwargs(c, plan_batches(64, 8, 8, 8), cuda=False)


def colocated(generation: dict[str, Any] | None = None, **grpo: Any) -> TrainerConfig:
    body = spec(**grpo).to_dict()
    body["generation"] = {"mode": "Colocate", **(generation or {})}
    return TrainerConfig.from_spec(
        "team",
        "math",
        None,
        GRPOJobSpec.model_validate(body),
        metric_url="http://math-metric:8080",
        generation_host="math-gen.team.svc",
    )


@pytest.mark.trainer
def test_colocate_mode_mapping_is_accepted_by_trl() -> None:
    """spec.generation.mode Colocate: TRL's colocate mode, one engine per process, the memory share and the
    context length from trainer.json, sleep mode off, no server to reach."""
    grpo_config = pytest.importorskip("trl.trainer.grpo_config", reason="needs the [trainer] extra (TRL)")

    c = colocated({"colocateMemoryShare": 0.45, "maxModelLen": 4096})
    assert c.generation.backend == "vllm-colocate" and c.generation.server_host is None
    kwargs = grpo_config_kwargs(c, plan_batches(64, 8, 8, 8), cuda=True)
    colocate = {key: value for key, value in kwargs.items() if key.startswith("vllm_") or key == "use_vllm"}
    assert colocate == {
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_tensor_parallel_size": 1,
        "vllm_enable_sleep_mode": False,
        "vllm_gpu_memory_utilization": 0.45,
        "vllm_max_model_length": 4096,
    }
    args = grpo_config.GRPOConfig(**{**kwargs, "bf16": False, "fp16": False, "use_cpu": True})
    assert (args.vllm_mode, args.vllm_gpu_memory_utilization, args.vllm_max_model_length) == (
        "colocate",
        0.45,
        4096,
    )
    # Unset in the spec: the operator's default share, and the model's own context length.
    kwargs = grpo_config_kwargs(colocated(), plan_batches(64, 8, 8, 8), cuda=True)
    assert kwargs["vllm_gpu_memory_utilization"] == 0.3 and "vllm_max_model_length" not in kwargs


def test_colocate_mode_refuses_what_the_engine_cannot_do() -> None:
    """maxStaleness and a context length shorter than a prompt and its answer (the API refuses both too: a
    hand-written trainer.json gets here), each with the fix."""
    c = colocated()
    stale = c.model_copy(update={"grpo": c.grpo.model_copy(update={"max_staleness": 1})})
    with pytest.raises(ConfigError, match=r"maxStaleness > 0 .* vllm-colocate.*remove maxStaleness"):
        grpo_config_kwargs(stale, plan_batches(64, 8, 8, 8), cuda=True)
    short = c.model_copy(update={"generation": c.generation.model_copy(update={"max_model_len": 64})})
    needed = short.grpo.max_prompt_length + short.grpo.max_completion_length
    with pytest.raises(ConfigError, match=rf"maxModelLen 64 is shorter .* at least {needed}"):
        grpo_config_kwargs(short, plan_batches(64, 8, 8, 8), cuda=True)


def test_load_config_errors_name_the_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "trainer.json"
    bad.write_text('{"job": {"namespace": "a", "name": "b"}}')
    with pytest.raises(
        ConfigError, match=r"trainer\.json is not a valid TrainerConfig: .*model: Field required"
    ):
        load_config(str(bad))
    sourceless = json.loads(config().dump_json())
    del sourceless["metric"]
    bad.write_text(json.dumps(sourceless))
    with pytest.raises(ConfigError, match=r"needs one of metric .*, rollouts .* and environment"):
        load_config(str(bad))
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(str(tmp_path / "missing.json"))
    good = tmp_path / "good.json"
    good.write_text(config().dump_json())
    assert load_config(str(good)).grpo.group_size == 8


def test_runtime_env() -> None:
    env = RuntimeEnv.from_environ(
        {"RANK": "3", "WORLD_SIZE": "8", "RESUME_FROM": "/workspace/checkpoints/step-5"}
    )
    assert (env.rank, env.world_size, env.is_main, env.resume_from) == (
        3,
        8,
        False,
        "/workspace/checkpoints/step-5",
    )
    with pytest.raises(ConfigError, match="inconsistent"):
        RuntimeEnv.from_environ({"RANK": "8", "WORLD_SIZE": "8"})


# spec.grpo knob (camelCase, as in a manifest) -> the GRPOConfig argument it becomes and the value there.
# Extra knobs a case needs to be a valid spec ride along in the third element.
FIELD_MAPPING: list[tuple[dict[str, Any], str, Any]] = [
    ({"importanceSamplingLevel": "sequence"}, "importance_sampling_level", "sequence"),
    ({"numIterations": 2}, "num_iterations", 2),
    ({"maskTruncatedCompletions": True}, "mask_truncated_completions", True),
    ({"topK": 20}, "top_k", 20),
    ({"minP": 0.05}, "min_p", 0.05),
    ({"repetitionPenalty": 1.1}, "repetition_penalty", 1.1),
    (
        {"chatTemplateKwargs": {"enable_thinking": "false"}},
        "chat_template_kwargs",
        {"enable_thinking": False},
    ),
    ({"vllmImportanceSamplingCorrection": False}, "vllm_importance_sampling_correction", False),
    ({"vllmImportanceSamplingMode": "token_truncate"}, "vllm_importance_sampling_mode", "token_truncate"),
    ({"vllmImportanceSamplingCap": 2.0}, "vllm_importance_sampling_clip_max", 2.0),
    ({"lossType": "grpo"}, "loss_type", "grpo"),
    ({"lossType": "bnpo"}, "loss_type", "bnpo"),
    ({"lossType": "dr_grpo"}, "loss_type", "dr_grpo"),
    ({"lossType": "dapo"}, "loss_type", "dapo"),
    ({"lossType": "cispo", "epsilonHigh": 5.0}, "loss_type", "cispo"),
    ({"lossType": "sapo"}, "loss_type", "sapo"),
    ({"lossType": "luspo", "importanceSamplingLevel": "sequence"}, "loss_type", "luspo"),
    ({"lossType": "vespo", "vllmImportanceSamplingMode": "token_mask"}, "loss_type", "vespo"),
]
# Each preset -> every GRPOConfig argument it decides (the trainer's own dynamic sampling is not TRL's).
PRESET_MAPPING: dict[str, dict[str, Any]] = {
    "dapo": {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28, "mask_truncated_completions": True},
    "dr-grpo": {"loss_type": "dr_grpo", "scale_rewards": "none"},
    "gspo": {
        "importance_sampling_level": "sequence",
        "loss_type": "grpo",
        "epsilon": 3e-4,
        "epsilon_high": 4e-4,
    },
}


def _mapping_id(case: tuple[dict[str, Any], str, Any]) -> str:
    return f"{next(iter(case[0]))}={next(iter(case[0].values()))}"


@pytest.mark.parametrize("case", FIELD_MAPPING, ids=_mapping_id)
def test_each_grpo_knob_reaches_trl_under_its_name(case: tuple[dict[str, Any], str, Any]) -> None:
    knobs, argument, value = case
    kwargs = grpo_config_kwargs(config(**knobs), plan_batches(64, 8, 8, 8), cuda=False)
    assert kwargs[argument] == value


def test_unset_knobs_leave_trl_its_defaults() -> None:
    kwargs = grpo_config_kwargs(config(), plan_batches(64, 8, 8, 8), cuda=False)
    for _, argument, _ in FIELD_MAPPING:
        if argument != "loss_type":  # loss_type has the project's default, dapo (TRL's too)
            assert argument not in kwargs, argument
    assert (kwargs["loss_type"], kwargs["epsilon"], kwargs["epsilon_high"], kwargs["scale_rewards"]) == (
        "dapo",
        0.2,
        None,
        "group",
    )


@pytest.mark.parametrize("preset", list(PRESET_MAPPING))
def test_each_preset_reaches_trl(preset: str) -> None:
    kwargs = grpo_config_kwargs(config(preset=preset), plan_batches(64, 8, 8, 8), cuda=False)
    assert {k: kwargs.get(k) for k in PRESET_MAPPING[preset]} == PRESET_MAPPING[preset]


@pytest.mark.trainer
@pytest.mark.parametrize("case", FIELD_MAPPING, ids=_mapping_id)
def test_trls_grpo_config_holds_each_knob(case: tuple[dict[str, Any], str, Any]) -> None:
    grpo_config = pytest.importorskip("trl.trainer.grpo_config", reason="needs the [trainer] extra (TRL)")
    knobs, argument, value = case
    args = grpo_config.GRPOConfig(
        **grpo_config_kwargs(config(**knobs), plan_batches(64, 8, 8, 8), cuda=False)
    )
    assert getattr(args, argument) == value


@pytest.mark.trainer
@pytest.mark.parametrize("preset", list(PRESET_MAPPING))
def test_trls_grpo_config_holds_each_preset(preset: str) -> None:
    grpo_config = pytest.importorskip("trl.trainer.grpo_config", reason="needs the [trainer] extra (TRL)")
    args = grpo_config.GRPOConfig(
        **grpo_config_kwargs(config(preset=preset), plan_batches(64, 8, 8, 8), cuda=False)
    )
    assert {k: getattr(args, k) for k in PRESET_MAPPING[preset]} == PRESET_MAPPING[preset]


def _sharded(base: TrainerConfig, **grpo: Any) -> TrainerConfig:
    trainer = base.trainer.model_copy(update={"sharding": "FSDP", "cpu_offload": True})
    return base.model_copy(update={"trainer": trainer, "grpo": base.grpo.model_copy(update=grpo)})


def test_fsdp_shards_through_accelerate_with_fp32_masters_and_offload_only_on_gpus() -> None:
    sharded = _sharded(config("transformers"))
    gpu = grpo_config_kwargs(sharded, plan_batches(64, 8, 8, 8), cuda=True)
    assert gpu["fsdp"] is True and gpu["fsdp_config"]["version"] == 2
    assert gpu["fsdp_config"]["state_dict_type"] == "SHARDED_STATE_DICT"
    assert (
        gpu["fsdp_config"]["cpu_offload"] is True and gpu["fsdp_config"]["activation_checkpointing"] is True
    )
    # FSDP's own activation checkpointing instead of transformers' (which would gather every layer again).
    assert gpu["gradient_checkpointing"] is False
    assert gpu["model_init_kwargs"]["dtype"] == "float32" and gpu["bf16"] is True
    cpu = grpo_config_kwargs(sharded, plan_batches(64, 8, 8, 8), cuda=False)
    assert cpu["fsdp_config"]["cpu_offload"] is False
    plain = grpo_config_kwargs(config("transformers"), plan_batches(64, 8, 8, 8), cuda=True)
    assert "fsdp" not in plain


def test_fsdp_in_a_hand_written_trainer_json_is_refused_where_the_api_refuses_it() -> None:
    lora = config("transformers").grpo.lora.model_copy(update={"enabled": True})
    with pytest.raises(ConfigError, match=r"FSDP is not supported with grpo\.lora\.enabled"):
        grpo_config_kwargs(_sharded(config("transformers"), lora=lora), plan_batches(64, 8, 8, 8), cuda=True)
    with pytest.raises(ConfigError, match="maxStaleness"):
        grpo_config_kwargs(_sharded(config(), max_staleness=1), plan_batches(64, 8, 8, 8), cuda=True)


def test_the_other_ranks_outwait_rank_0_riding_out_a_replaced_vllm_server_or_a_steps_episodes() -> None:
    from grpo_operator.api.environment import EnvironmentClientConfig

    plan = plan_batches(64, 8, 8, 8)
    server = config()
    gen = server.generation
    timeout = grpo_config_kwargs(server, plan, cuda=False)["ddp_timeout"]
    # A failed request, the replacement's whole start-up budget, the push into it, the request again.
    assert timeout >= gen.startup_timeout_seconds + 3 * gen.request_timeout_seconds
    assert timeout == 1800 + 3 * 600 + 300
    # In-process generation has no server to wait for: transformers' default.
    assert grpo_config_kwargs(config("transformers"), plan, cuda=False)["ddp_timeout"] == 1800
    # Rank 0 runs all 512 episodes of a step, 16 at a time, each up to 4 turns of a request and a step.
    env = EnvironmentClientConfig(url="http://math-env:8000", max_turns=4, concurrency=16, timeout_seconds=60)
    episodes = server.model_copy(update={"environment": env})
    assert grpo_config_kwargs(episodes, plan, cuda=False)["ddp_timeout"] == timeout + 32 * 4 * (600 + 60)


def test_a_start_up_budget_longer_than_transformers_collective_timeout_raises_it() -> None:
    grpo_config = pytest.importorskip("trl.trainer.grpo_config", reason="needs the [trainer] extra (TRL)")
    c = config()
    slow = c.model_copy(
        update={"generation": c.generation.model_copy(update={"startup_timeout_seconds": 7200})}
    )
    kwargs = grpo_config_kwargs(slow, plan_batches(64, 8, 8, 8), cuda=False)
    assert grpo_config.GRPOConfig(**kwargs).ddp_timeout == 7200 + 3 * 600 + 300
