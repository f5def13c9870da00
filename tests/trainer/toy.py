"""The toy task the trainer tests learn: answer with as many 'a' characters as possible.

A randomly initialised character model emits 'a' about 1/60 of the time, so the mean reward starts near
0; GRPO with a high learning rate drives it toward 1 within tens of steps. An empty completion cannot be
scored and raises FormatFailure, which exercises formatFailureScore on the real path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from grpo_metric import FormatFailure

from tests.harness.ports import free_port

REPO = Path(__file__).resolve().parents[2]
TARGET = "a"


def fraction_of_target(example: dict[str, Any], completion: str) -> float:
    if not completion:
        raise FormatFailure("empty completion")
    return completion.count(example.get("answer", TARGET)) / len(completion)


def write_dataset(path: Path, rows: int = 64) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for i in range(rows):
            handle.write(
                json.dumps({"prompt": f"q{i % 10}{chr(98 + i % 20)}:", "answer": TARGET, "row": i}) + "\n"
            )
    return path


def trainer_config(
    workdir: Path,
    model_dir: Path,
    metric_url: str,
    *,
    steps: int = 10,
    group_size: int = 8,
    prompts_per_step: int = 4,
    learning_rate: float = 0.02,
    every_steps: int = 5,
    keep_last: int = 2,
    error_budget: float = 0.05,
    validation_every: int = 0,
    validation_score_path: str | None = None,
    dynamic_sampling: bool = False,
    max_completion_length: int = 8,
    job: tuple[str, str] = ("default", "toy"),
    extra: dict[str, Any] | None = None,
) -> Path:
    train = write_dataset(workdir / "data" / "train.jsonl")
    val = write_dataset(workdir / "data" / "val.jsonl", rows=8)
    config: dict[str, Any] = {
        "apiVersion": "grpo.dev/v1alpha1",
        "kind": "TrainerConfig",
        "job": {"namespace": job[0], "name": job[1]},
        "model": {"name": str(model_dir), "dtype": "float32"},
        "dataset": {"train": f"file://{train}", "validation": f"file://{val}"},
        "grpo": {
            "groupSize": group_size,
            "promptsPerStep": prompts_per_step,
            "steps": steps,
            "learningRate": learning_rate,
            "maxCompletionLength": max_completion_length,
            "maxPromptLength": 16,
            "dynamicSampling": dynamic_sampling,
            "validation": {
                "everySteps": validation_every,
                "maxPrompts": 8,
                **({"scorePath": validation_score_path} if validation_score_path else {}),
            },
        },
        "trainer": {"nodes": 1, "gpusPerNode": 1, "perDeviceBatchSize": group_size},
        "generation": {"backend": "transformers"},
        "metric": {
            "url": metric_url,
            "batchSize": 8,
            "concurrency": 2,
            "timeoutSeconds": 5,
            "maxRetries": 1,
            "errorBudget": error_budget,
        },
        "checkpoints": {"dir": str(workdir / "ckpt"), "everySteps": every_steps, "keepLast": keep_last},
        "outputDir": str(workdir / "out"),
        "metricsPort": free_port(),
        "statusPatchIntervalSeconds": 1.0,
    }
    if extra:
        config.update(extra)
    path = workdir / "trainer.json"
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return path


def trainer_env(config: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "RESUME_FROM", "KUBECONFIG")
    }
    env.update(
        GRPO_CONFIG=str(config),
        GRPO_METRIC_READY_TIMEOUT_SECONDS="30",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
    )
    env.update(extra)
    return env


def torchrun_command(processes: int = 2) -> list[str]:
    """The trainer under torchrun on this machine, as a trainer pod of ``processes`` GPUs runs it (one node;
    each call takes a rendezvous port of its own)."""
    return [
        str(Path(sys.executable).with_name("torchrun")),
        "--nnodes=1",
        f"--nproc-per-node={processes}",
        "--node-rank=0",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        "-m",
        "grpo_trainer",
    ]


def start_trainer(config: Path, log: Path, **extra: str) -> subprocess.Popen[bytes]:
    handle = log.open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "grpo_trainer"],
        cwd=REPO,
        env=trainer_env(config, **extra),
        stdout=handle,
        stderr=handle,
    )


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def train_prompts(workdir: Path) -> dict[int, list[str]]:
    """Each step's training prompts as samples.jsonl records them (the first groups rank 0 trained on)."""
    by_step: dict[int, list[str]] = {}
    for sample in read_jsonl(workdir / "out" / "samples.jsonl"):
        if sample["split"] == "train":
            by_step.setdefault(sample["step"], []).append(sample["prompt"])
    return by_step
