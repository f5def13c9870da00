"""model.dtype onto load dtype and mixed precision: float16 full fine-tuning keeps fp32 master weights under
fp16 autocast, because the GradScaler fp16 needs refuses fp16 gradients ("Attempting to unscale FP16
gradients", first optimizer step on an H200). The optimizer step below is the one accelerate runs on a GPU
with fp16 mixed precision (autocast, scaled backward, unscale, clip, scaler step), on the CPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from grpo_trainer.grpo_config import grpo_config_kwargs, load_config, plan_batches

from tests.trainer.toy import trainer_config

pytestmark = pytest.mark.trainer


def kwargs_for(tmp_path: Path, model: Path, dtype: str, *, lora: bool, cuda: bool) -> dict[str, Any]:
    path = trainer_config(tmp_path, model, "http://127.0.0.1:9")
    raw = json.loads(path.read_text())
    raw["model"]["dtype"] = dtype
    raw["grpo"]["lora"] = {"enabled": lora, "targetModules": ["q_proj", "v_proj"]}
    path.write_text(json.dumps(raw))
    config = load_config(str(path))
    return grpo_config_kwargs(config, plan_batches(4, 8, 8, 1), cuda=cuda)


@pytest.mark.parametrize(
    ("dtype", "lora", "load", "bf16", "fp16"),
    [
        ("float16", False, "float32", False, True),  # fp32 master weights, fp16 autocast + GradScaler
        ("float16", True, "float16", False, True),  # frozen fp16 base, fp32 adapters (PEFT)
        ("bfloat16", False, "float32", True, False),  # fp32 master weights, bf16 autocast
        ("bfloat16", True, "bfloat16", True, False),  # frozen bf16 base, fp32 adapters (PEFT)
        ("float32", False, "float32", False, False),
    ],
)
def test_training_arguments_per_dtype_on_gpu(
    tmp_path: Path, tiny_model: Path, dtype: str, lora: bool, load: str, bf16: bool, fp16: bool
) -> None:
    from trl.trainer.grpo_config import GRPOConfig

    kwargs = kwargs_for(tmp_path, tiny_model, dtype, lora=lora, cuda=True)
    assert kwargs["model_init_kwargs"]["dtype"] == load
    assert (kwargs["bf16"], kwargs["fp16"]) == (bf16, fp16)
    if bf16 and not torch.cuda.is_available():
        return  # transformers refuses bf16 mixed precision without a bf16-capable GPU
    args = GRPOConfig(**kwargs)
    assert (args.bf16, args.fp16) == (bf16, fp16)


def test_cpu_runs_compute_in_bf16_as_gpu_runs_do_but_never_fp16(tmp_path: Path, tiny_model: Path) -> None:
    """bf16 autocast exists on the CPU, so tests and the demo train at the numerics users get; fp16 would
    need a GradScaler, which only pays on a GPU."""
    from trl.trainer.grpo_config import GRPOConfig

    kwargs = kwargs_for(tmp_path, tiny_model, "float16", lora=False, cuda=False)
    assert kwargs["model_init_kwargs"]["dtype"] == "float32"
    assert kwargs["fp16"] is False and kwargs["bf16"] is False and kwargs["use_cpu"] is True
    kwargs = kwargs_for(tmp_path, tiny_model, "bfloat16", lora=False, cuda=False)
    assert kwargs["model_init_kwargs"]["dtype"] == "float32"
    assert kwargs["bf16"] is True and kwargs["use_cpu"] is True
    assert GRPOConfig(**kwargs).bf16 is True


def _fp16_mixed_precision_step(model: torch.nn.Module) -> None:
    """One optimizer step as accelerate takes it with fp16 mixed precision and max_grad_norm."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    ids = torch.randint(3, 40, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(input_ids=ids, labels=ids).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(trainable, 1.0)
    scaler.step(optimizer)
    scaler.update()


def _load(model_dir: Path, kwargs: dict[str, Any]) -> torch.nn.Module:
    from trl.trainer.utils import create_model_from_path

    return create_model_from_path(str(model_dir), **kwargs["model_init_kwargs"])


def test_float16_full_fine_tuning_takes_an_optimizer_step(tmp_path: Path, tiny_model: Path) -> None:
    kwargs = kwargs_for(tmp_path, tiny_model, "float16", lora=False, cuda=True)
    model = _load(tiny_model, kwargs)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    before = [p.detach().clone() for p in model.parameters()]
    _fp16_mixed_precision_step(model)
    after = list(model.parameters())
    assert all(torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True)), "the step changed nothing"

    # What the trainer did before: weights loaded in float16 crash at exactly this point.
    fp16_weights = _load(tiny_model, {"model_init_kwargs": {"dtype": "float16"}})
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        _fp16_mixed_precision_step(fp16_weights)


def test_float16_lora_keeps_an_fp16_base_and_trains_fp32_adapters(tmp_path: Path, tiny_model: Path) -> None:
    from peft import LoraConfig, get_peft_model

    kwargs = kwargs_for(tmp_path, tiny_model, "float16", lora=True, cuda=True)
    base = _load(tiny_model, kwargs)
    # As TRL builds it (get_peft_model with PEFT's default autocast_adapter_dtype=True).
    model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    )
    trainable = {p.dtype for p in model.parameters() if p.requires_grad}
    frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
    assert trainable == {torch.float32} and frozen == {torch.float16}
    before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    _fp16_mixed_precision_step(model)
    after = [p for p in model.parameters() if p.requires_grad]
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_weights_leave_for_vllm_in_the_served_dtype() -> None:
    """fp32 master weights go to vLLM as bf16: half the bytes, and what vLLM would round them to anyway."""
    from grpo_trainer.weight_sync import served_tensors

    master = torch.randn(4, 4)
    counter = torch.arange(3)
    already = torch.zeros(2, dtype=torch.bfloat16)
    sent = dict(served_tensors(iter([("w", master), ("n", counter), ("b", already)]), "bfloat16"))
    assert sent["w"].dtype == torch.bfloat16 and torch.equal(sent["w"], master.to(torch.bfloat16))
    assert sent["n"] is counter and sent["b"] is already
    assert dict(served_tensors(iter([("w", master)]), None))["w"] is master


class _RecordingClient:
    """Stands in for TRL's VLLMClient: records the metadata and the tensors a sync sends, as they are sent."""

    def __init__(self) -> None:
        self.metadata: list[tuple[str, str, list[int]]] = []
        self.sent: list[tuple[str, torch.dtype, int]] = []

    def update_named_params(self, metadata: list[Any], params: Any) -> None:
        self.metadata = list(metadata)
        self.sent = [(name, t.dtype, t.numel() * t.element_size()) for name, t in params]

    def reset_prefix_cache(self) -> None:
        pass


def _sync(model: torch.nn.Module, dtype: str) -> _RecordingClient:
    """One server-mode weight sync through the trainer's own VLLMGeneration subclass (TRL's sync_weights and
    _iter_named_params, the project's cast), with no vLLM: what reaches update_named_params is what a real
    client would broadcast or write."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    from grpo_trainer.served_generation import generation_class

    cls: Any = generation_class(None, None, None, served_dtype=dtype)
    # Built without __init__, which would start a vLLM client: the attributes the sync reads are set below.
    generation = object.__new__(cls)
    client = _RecordingClient()
    generation.__dict__.update(
        mode="server",
        model=model,
        vllm_client=client,
        accelerator=SimpleNamespace(is_main_process=True),
        _dist=SimpleNamespace(is_fsdp=False, gather_params=lambda params: nullcontext()),
        _weight_metadata=None,
    )
    generation.sync_weights()
    return client


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_sync_sends_the_served_dtype_never_the_fp32_masters(
    tmp_path: Path, tiny_model: Path, dtype: str
) -> None:
    """Full fine-tuning holds fp32 masters; vLLM gets every parameter once, cast to the dtype it serves:
    parameters x 2 bytes, the figure docs/trainer.md ("Weight sync") states."""
    model = _load(tiny_model, kwargs_for(tmp_path, tiny_model, dtype, lora=False, cuda=True))
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    client = _sync(model, dtype)
    parameters = sum(p.numel() for p in model.parameters())
    assert {sent_dtype for _, sent_dtype, _ in client.sent} == {getattr(torch, dtype)}
    assert {meta_dtype for _, meta_dtype, _ in client.metadata} == {dtype}
    assert sum(size for _, _, size in client.sent) == parameters * 2
    assert [name for name, _, _ in client.sent] == [name for name, _, _ in client.metadata]


def test_a_lora_sync_sends_the_whole_merged_model_in_the_served_dtype(
    tmp_path: Path, tiny_model: Path
) -> None:
    """LoRA: the adapter (fp32) is merged into the bf16 base and every base parameter is sent, none of the
    adapter's own: the whole model's bytes each sync."""
    from peft import LoraConfig, get_peft_model

    base = _load(tiny_model, kwargs_for(tmp_path, tiny_model, "bfloat16", lora=True, cuda=True))
    base_parameters = sum(p.numel() for p in base.parameters())
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(base, config)
    client = _sync(model, "bfloat16")
    assert {sent_dtype for _, sent_dtype, _ in client.sent} == {torch.bfloat16}
    assert not any("lora_" in name for name, _, _ in client.sent)
    assert sum(size for _, _, size in client.sent) == base_parameters * 2
