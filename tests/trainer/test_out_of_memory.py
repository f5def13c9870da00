"""CUDA running out of memory is a permanent failure with its own exit code and a message that says what ran
out and which settings lower the need: retrying the same model and batch would only run out again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from grpo_trainer import main as trainer_main
from grpo_trainer.errors import ExitCode, is_cuda_out_of_memory

from tests.trainer.toy import trainer_config

pytestmark = pytest.mark.trainer

# The first line torch 2.x raises when an allocation does not fit, allocator advice included.
TORCH_OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
    "1.06 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory in use. If reserved "
    "but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
)


def test_cuda_out_of_memory_is_recognised_directly_and_when_wrapped() -> None:
    assert is_cuda_out_of_memory(torch.cuda.OutOfMemoryError(TORCH_OOM))
    assert is_cuda_out_of_memory(RuntimeError("CUDA error: out of memory\nCUDA kernel errors ..."))
    try:
        try:
            raise torch.cuda.OutOfMemoryError(TORCH_OOM)
        except RuntimeError as inner:
            raise ValueError("generation failed") from inner
    except ValueError as wrapped:
        assert is_cuda_out_of_memory(wrapped)
    assert not is_cuda_out_of_memory(RuntimeError("NCCL watchdog timeout"))
    assert not is_cuda_out_of_memory(MemoryError())  # host memory: the kernel's OOM killer, not CUDA


def test_trainer_exits_with_the_out_of_memory_code_and_says_what_to_try(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = trainer_config(tmp_path, tiny_model, "http://127.0.0.1:9", steps=1)

    def out_of_memory(*_: Any) -> int:
        # Where a real run meets it: the first forward pass that does not fit on the GPU.
        raise torch.cuda.OutOfMemoryError(TORCH_OOM)

    monkeypatch.setattr(trainer_main, "run", out_of_memory)
    monkeypatch.setenv("GRPO_CONFIG", str(config))
    code = trainer_main.main([str(config)])
    assert code == int(ExitCode.OUT_OF_MEMORY) == 6
    line = next(x for x in capsys.readouterr().err.splitlines() if x.startswith("grpo-trainer:"))
    assert line.startswith("grpo-trainer: out-of-memory: the trainer ran out of GPU memory")
    assert "Tried to allocate 2.00 GiB" in line and "PYTORCH_CUDA_ALLOC_CONF" not in line
    assert "LoRA (spec.grpo.lora.enabled: true)" in line and "more trainer GPUs" in line
