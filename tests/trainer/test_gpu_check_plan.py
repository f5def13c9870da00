"""bench/gpu_check.py decides, before building anything, which checks this machine can run, and says why
for the others: the NCCL check needs two GPUs (NCCL refuses two ranks of a group on one GPU), every
served-weights check needs vLLM, the broadcast to two replicas three GPUs, and the asynchronous-GRPO
comparison needs vLLM and the trainer on two GPUs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from bench import gpu_check

pytestmark = pytest.mark.trainer


def test_one_gpu_without_vllm_runs_the_training_checks_and_says_why_not_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The GPU machine this project is lent: one GPU, no vLLM."""
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else object())
    names = [name for name, _ in gpu_check.check_plan(gpu_check.GPU)]
    reasons = {name: gpu_check.not_run_reason(name, cuda=True, gpus=1, smoke=False) for name in names}
    runnable = [n for n in names if not n.startswith("served_") and n != "async_overlap"]
    assert [n for n, r in reasons.items() if r is None] == runnable
    assert "needs 2 GPUs, this machine has 1" in str(reasons["served_weights_nccl"])
    assert "Duplicate GPU detected" in str(reasons["served_weights_nccl"])
    assert "vllm package is not installed" in str(reasons["served_weights_volume"])
    assert "needs 3 GPUs, this machine has 1" in str(reasons["served_weights_broadcast_2"])
    assert "needs 2 GPUs" in str(reasons["async_overlap"])


def test_two_gpus_with_vllm_run_the_nccl_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    assert gpu_check.not_run_reason("served_weights_nccl", cuda=True, gpus=2, smoke=False) is None
    assert gpu_check.not_run_reason("served_weights_volume", cuda=True, gpus=1, smoke=False) is None
    assert gpu_check.not_run_reason("async_overlap", cuda=True, gpus=2, smoke=False) is None
    assert gpu_check.not_run_reason("async_overlap", cuda=True, gpus=1, smoke=False) is not None
    assert gpu_check.not_run_reason("served_weights_broadcast_2", cuda=True, gpus=2, smoke=False) is not None
    assert gpu_check.not_run_reason("served_weights_broadcast_2", cuda=True, gpus=3, smoke=False) is None


def test_without_cuda_every_check_is_listed_as_not_run(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "gpu-check.json"
    assert gpu_check.main(["--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["mode"] == "no-cuda" and result["ok"] is True
    assert len(result["checks"]) == len(gpu_check.check_plan(gpu_check.GPU))
    assert all(check["not_run"] for check in result["checks"].values())
