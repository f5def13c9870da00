"""The memory plan at trainer start (trainer_image/grpo_trainer/memory_plan.py): parameter counts of real
model shapes, what fits an 80 GB GPU, the settings the message suggests (computed, and fitting), and the
exit code the trainer leaves with through main.py's own error route. Pure: no torch, no GPU (the GPU's
size is handed in)."""

from __future__ import annotations

import dataclasses
import logging
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from grpo_operator.api.exit_codes import BY_CODE, ExitCode
from grpo_operator.api.spec import GRPOJobSpec
from grpo_operator.api.trainer_config import TrainerConfig
from grpo_operator.reconcile.restart_policy import TRAINER_EXIT_REASONS
from grpo_trainer import errors, memory_plan
from grpo_trainer import main as trainer_main
from grpo_trainer import steps as trainer_steps
from grpo_trainer.errors import MemoryPlanExceeded
from grpo_trainer.grpo_config import RuntimeEnv
from grpo_trainer.memory_plan import (
    GIB,
    JobShape,
    ModelShape,
    UnplannableModel,
    alternatives,
    fits,
    message,
    min_gpus,
    plan_memory,
)

# config.json of Qwen/Qwen2.5-1.5B-Instruct and Qwen/Qwen2.5-7B-Instruct (the figures that size them).
QWEN_1_5B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 151936,
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}
QWEN_7B: dict[str, Any] = {
    **QWEN_1_5B,
    "vocab_size": 152064,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
}
# An 80 GB H100 as CUDA reports it (torch.cuda.get_device_properties(0).total_memory).
H100 = 81_559 * 1024**2
GRPO_JOB = JobShape(per_device_batch_size=4, max_prompt_length=512, max_completion_length=1024)


@pytest.mark.parametrize(("config", "expected"), [(QWEN_1_5B, 1.54e9), (QWEN_7B, 7.6e9)])
def test_parameter_count_of_real_qwen_shapes(config: dict[str, Any], expected: float) -> None:
    count = ModelShape.from_config(config).parameter_count()
    assert abs(count - expected) / expected < 0.02, count


def test_tied_embeddings_are_counted_once_and_head_dim_defaults_to_hidden_over_heads() -> None:
    tied = ModelShape.from_config(QWEN_1_5B)
    untied = ModelShape.from_config({**QWEN_1_5B, "tie_word_embeddings": False})
    assert untied.parameter_count() - tied.parameter_count() == 151936 * 1536
    assert tied.head_dim == 128 and tied.kv_dim == 256
    assert ModelShape.from_config({**QWEN_1_5B, "head_dim": 64}).q_dim == 12 * 64


def test_configs_the_plan_cannot_size_are_refused_not_guessed() -> None:
    with pytest.raises(UnplannableModel, match="intermediate_size"):
        ModelShape.from_config({k: v for k, v in QWEN_7B.items() if k != "intermediate_size"})
    with pytest.raises(UnplannableModel, match="mixture-of-experts"):
        ModelShape.from_config({**QWEN_7B, "num_experts": 64})
    # A multimodal config keeps its decoder in text_config.
    nested = {"model_type": "qwen2_5_vl", "text_config": QWEN_7B}
    assert (
        ModelShape.from_config(nested).parameter_count() == ModelShape.from_config(QWEN_7B).parameter_count()
    )


def test_precision_model_bytes_per_parameter() -> None:
    model = ModelShape.from_config(QWEN_7B)
    params = model.parameter_count()
    for dtype in ("bfloat16", "float16", "float32"):
        full = plan_memory(model, dataclasses.replace(GRPO_JOB, dtype=dtype))
        assert (full.weights, full.gradients, full.optimizer) == (4 * params, 4 * params, 8 * params)
    lora = plan_memory(model, dataclasses.replace(GRPO_JOB, lora=True))
    adapters = model.lora_parameter_count(16, ("q_proj", "k_proj", "v_proj", "o_proj"))
    assert lora.trainable_parameters == adapters == 28 * 16 * ((3584 + 3584) * 2 + (3584 + 512) * 2)
    assert lora.weights == 2 * params + 4 * adapters
    assert (lora.gradients, lora.optimizer) == (4 * adapters, 8 * adapters)
    lora32 = plan_memory(model, dataclasses.replace(GRPO_JOB, lora=True, dtype="float32"))
    assert lora32.weights == 4 * params + 4 * adapters
    everything = model.lora_parameter_count(16, ["all-linear"])
    assert everything > adapters and model.lora_parameter_count(16, ["lm_head"]) == 0


def test_fsdp_divides_the_states_and_offload_takes_the_optimizer_off_the_gpu() -> None:
    model = ModelShape.from_config(QWEN_7B)
    ddp = plan_memory(model, dataclasses.replace(GRPO_JOB, world_size=4))
    fsdp = plan_memory(model, dataclasses.replace(GRPO_JOB, world_size=4, sharding="fsdp"))
    offload = plan_memory(
        model, dataclasses.replace(GRPO_JOB, world_size=4, sharding="fsdp", optimizer_offload=True)
    )
    assert ddp.total == plan_memory(model, GRPO_JOB).total, "plain DDP: every rank holds everything"
    assert fsdp.weights == -(-ddp.weights // 4) and fsdp.optimizer == -(-ddp.optimizer // 4)
    assert fsdp.activations == ddp.activations
    assert offload.optimizer == 0 and offload.weights == fsdp.weights
    with pytest.raises(ValueError, match="offload needs sharding"):
        JobShape(optimizer_offload=True)


def test_activations_follow_the_stated_formula() -> None:
    model = ModelShape.from_config(QWEN_7B)
    plan = plan_memory(model, GRPO_JOB)
    tokens = 4 * (512 + 1024)
    one_layer = tokens * (8 * 3584 + 2 * 512 + 4 * 18944) * 2
    assert plan.activations == 28 * tokens * 3584 * 2 + 2 * one_layer
    assert plan.lm_head == 2 * 4096 * 32768 * 4
    unfused = plan_memory(model, dataclasses.replace(GRPO_JOB, fused_lm_head=False))
    assert unfused.lm_head == 2 * 4 * 1024 * 152064 * 4
    assert unfused.lm_head > unfused.activations, "the full logits: the largest activation for GRPO"
    no_checkpointing = plan_memory(model, dataclasses.replace(GRPO_JOB, gradient_checkpointing=False))
    assert no_checkpointing.activations == 28 * one_layer


def test_7b_full_fine_tuning_under_ddp_does_not_fit_80gb_and_the_message_names_fsdp_that_does() -> None:
    model = ModelShape.from_config(QWEN_7B)
    plan = plan_memory(model, GRPO_JOB)
    assert not fits(plan, H100)
    assert plan.total > 100 * GIB
    text = message(plan, H100)
    found = re.search(r"spec\.trainer\.sharding FSDP over (\d+) GPUs it needs ([\d.]+) GiB per GPU", text)
    assert found, text
    gpus = int(found.group(1))
    suggested = plan_memory(model, dataclasses.replace(GRPO_JOB, sharding="fsdp", world_size=gpus))
    assert fits(suggested, H100) and f"{suggested.total / GIB:.1f}" == found.group(2)
    fewer = dataclasses.replace(suggested.job, world_size=gpus - 1)
    assert not fits(plan_memory(model, fewer), H100), "the suggestion is the fewest GPUs that fit"
    assert "LoRA (spec.grpo.lora.enabled: true, r=16, sharding DDP)" in text
    assert "spec.trainer.sharding FSDP and cpuOffload: true over 1 GPU" in text
    # Every suggestion fits, by the same plan.
    for _, alternative in alternatives(model, GRPO_JOB, H100):
        assert fits(alternative, H100)


def test_with_the_jobs_own_gpus_fsdp_is_suggested_on_them() -> None:
    model = ModelShape.from_config(QWEN_7B)
    job = dataclasses.replace(GRPO_JOB, world_size=8)
    text = message(plan_memory(model, job), H100)
    assert "spec.trainer.sharding FSDP over 8 GPUs" in text


def test_7b_lora_fits_80gb() -> None:
    plan = plan_memory(ModelShape.from_config(QWEN_7B), dataclasses.replace(GRPO_JOB, lora=True))
    assert fits(plan, H100)
    assert message(plan, H100).endswith("it fits")


def test_a_model_no_setting_fits_says_so() -> None:
    huge = ModelShape.from_config({**QWEN_7B, "hidden_size": 65536, "intermediate_size": 262144})
    plan = plan_memory(huge, GRPO_JOB)
    assert min_gpus(huge, dataclasses.replace(GRPO_JOB, lora=True), H100) is None
    assert "No setting fits" in message(plan, 1 * GIB)


def test_headroom_is_a_fraction_of_the_gpu() -> None:
    plan = plan_memory(ModelShape.from_config(QWEN_1_5B), GRPO_JOB)
    assert fits(plan, plan.total, headroom=0.0) and not fits(plan, plan.total)
    with pytest.raises(ValueError, match="headroom"):
        fits(plan, H100, headroom=1.0)


# The trainer's start.


def trainer_config(tmp_path: Path, *, lora: bool = False, trainer: dict[str, Any] | None = None) -> Path:
    body: dict[str, Any] = {
        "model": {"name": "Qwen/Qwen2.5-7B-Instruct"},
        "dataset": {"train": "hf://openai/gsm8k:main#train"},
        "grpo": {
            "groupSize": 8,
            "promptsPerStep": 4,
            "steps": 10,
            "maxPromptLength": 512,
            "maxCompletionLength": 1024,
            "lora": {"enabled": lora},
        },
        "metric": {"image": "registry/metric:1"},
        "trainer": {"nodes": 1, "gpusPerNode": 1, "perDeviceBatchSize": 4, **(trainer or {})},
    }
    config = TrainerConfig.from_spec(
        "team",
        "math",
        None,
        GRPOJobSpec.model_validate(body),
        metric_url="http://math-metric:8080",
        generation_host="math-gen.team.svc",
    )
    path = tmp_path / "trainer.json"
    path.write_text(config.dump_json(), encoding="utf-8")
    return path


@pytest.fixture
def start(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """main.py's start with a 7B config.json and an 80 GB GPU handed in; returns the termination messages."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "RESUME_FROM", "GRPO_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(memory_plan, "read_model_config", lambda name, revision: QWEN_7B)
    monkeypatch.setattr(trainer_steps, "gpu_memory", lambda env: H100)
    # What run() installs for a real process: no SIGTERM handler or retry hook left behind in pytest.
    monkeypatch.setattr(signal, "signal", lambda *_: None)
    monkeypatch.setattr(trainer_main, "stop_retrying_when", lambda _: None)
    written: list[str] = []
    monkeypatch.setattr(errors, "write_termination_message", written.append)
    return written


def test_the_trainer_exits_with_the_memory_plan_code_before_loading_anything(
    tmp_path: Path,
    start: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def never(*_: Any) -> Any:
        raise AssertionError("nothing is claimed or loaded when the plan does not fit")

    monkeypatch.setattr(trainer_main, "claim_workspace", never)
    code = trainer_main.main([str(trainer_config(tmp_path))])
    assert code == int(ExitCode.MEMORY_PLAN_EXCEEDED) == 8
    assert BY_CODE[ExitCode.MEMORY_PLAN_EXCEEDED].permanent
    assert TRAINER_EXIT_REASONS[ExitCode.MEMORY_PLAN_EXCEEDED] == "MemoryPlanExceeded"
    line = next(x for x in capsys.readouterr().err.splitlines() if x.startswith("grpo-trainer:"))
    assert line.startswith("grpo-trainer: memory-plan-exceeded: the training needs about ")
    assert "spec.trainer.sharding FSDP over 2 GPUs" in line and "LoRA" in line
    assert written_once(start) in line


def written_once(messages: list[str]) -> str:
    assert len(messages) == 1
    return messages[0]


def test_a_plan_that_fits_is_logged_and_the_start_goes_on(
    tmp_path: Path, start: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    config = TrainerConfig.load(trainer_config(tmp_path, lora=True))
    with caplog.at_level(logging.INFO, logger="grpo_trainer.memory_plan"):
        trainer_steps.check_memory(config, RuntimeEnv())
    assert "memory plan:" in caplog.text and "it fits" in caplog.text
    assert not start


def test_on_the_cpu_the_plan_is_only_logged(
    tmp_path: Path, start: list[str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(trainer_steps, "gpu_memory", lambda env: None)
    config = TrainerConfig.load(trainer_config(tmp_path))
    with caplog.at_level(logging.INFO, logger="grpo_trainer.memory_plan"):
        trainer_steps.check_memory(config, RuntimeEnv())
    assert "not checked on the CPU" in caplog.text and "7.62B parameters" in caplog.text


def test_a_config_json_the_plan_cannot_read_lets_the_job_run(
    tmp_path: Path, start: list[str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def offline(name: str, revision: str | None) -> dict[str, Any]:
        raise OSError("no network")

    monkeypatch.setattr(memory_plan, "read_model_config", offline)
    config = TrainerConfig.load(trainer_config(tmp_path))
    with caplog.at_level(logging.INFO, logger="grpo_trainer.memory_plan"):
        assert (
            memory_plan.check_job(config, 1, H100, log=logging.getLogger("grpo_trainer.memory_plan")) is None
        )
    assert "memory plan skipped" in caplog.text and "no network" in caplog.text


def test_the_colocated_engines_share_is_not_the_trainers(tmp_path: Path) -> None:
    # 1.5B full fine-tuning fits an 80 GB GPU of its own, not the 10 % a colocated engine would leave of it.
    config = TrainerConfig.load(trainer_config(tmp_path))
    config = config.model_copy(
        update={
            "generation": config.generation.model_copy(
                update={"backend": "vllm-colocate", "colocate_memory_share": 0.9, "server_host": None}
            )
        }
    )
    plan = memory_plan.check_job(config, 1, H100 * 10, read_config=lambda *_: QWEN_1_5B)
    assert plan is not None and fits(plan, H100)
    with pytest.raises(MemoryPlanExceeded, match="colocated vLLM engine takes 90% of the GPU"):
        memory_plan.check_job(config, 1, H100, read_config=lambda *_: QWEN_1_5B)


def test_trainer_sharding_is_read_when_the_config_has_it(tmp_path: Path) -> None:
    config = TrainerConfig.load(trainer_config(tmp_path))
    assert memory_plan.job_shape(config, 4, True).sharding == "none"
    topology = config.trainer.model_copy(update={"sharding": "FSDP", "cpu_offload": True})
    shaped = memory_plan.job_shape(config.model_copy(update={"trainer": topology}), 4, True)
    assert (shaped.sharding, shaped.optimizer_offload) == ("fsdp", True)
    ddp = config.trainer.model_copy(update={"sharding": "DDP"})
    assert memory_plan.job_shape(config.model_copy(update={"trainer": ddp}), 4, True).sharding == "none"


def test_the_trainer_doc_shows_the_table_bench_memory_table_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench import memory_table

    assert memory_table.main([]) == 0
    table = capsys.readouterr().out
    doc = (Path(__file__).resolve().parents[2] / "docs" / "trainer.md").read_text(encoding="utf-8")
    assert table in doc, "docs/trainer.md 'Memory planning' is stale: paste `python bench/memory_table.py`"
    assert "| Qwen2.5-7B | 7.62B | 80 GB | — | 2 | 1 | 1 |" in table
