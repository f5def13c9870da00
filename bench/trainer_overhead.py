"""Step time of this trainer against bare TRL on the same tiny configuration.

    .venv/bin/python bench/trainer_overhead.py [--steps 30] [--warmup 3]

Bare TRL: GRPOTrainer with the reward as an in-process Python function, TRL's own advantages, no
checkpoints/status/metrics. This trainer: ``python -m grpo_trainer`` with the same model, data and
GRPO settings, the reward served over HTTP by the metric SDK, checkpoints off the measured steps.
Prints the median step time of each, their ratio, and the share of this trainer's step time spent
waiting for remote scoring. CPU, tiny model: the absolute numbers only say that the overhead is small
next to generation; on GPUs generation dominates even more."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from grpo_metric import FormatFailure, MetricServer

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run by path: `python bench/trainer_overhead.py`
    sys.path.insert(0, str(REPO))

from tests.harness.ports import free_port  # noqa: E402

GROUP, PROMPTS, COMPLETION_TOKENS, LR, SEED = 8, 4, 8, 0.02, 42


def reward_value(completion: str) -> float:
    if not completion:
        raise FormatFailure("empty completion")
    return completion.count("a") / len(completion)


def http_metric(example: dict[str, Any], completion: str) -> float:
    return reward_value(completion)


def write_data(path: Path) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for i in range(64):
            handle.write(json.dumps({"prompt": f"q{i % 10}{chr(98 + i % 20)}:", "answer": "a"}) + "\n")


def bare_trl(
    model: Path,
    data: Path,
    out: Path,
    steps: int,
    *,
    cuda: bool = False,
    dtype: str = "float32",
    completion_tokens: int = COMPLETION_TOKENS,
) -> list[float]:
    """Step times of bare TRL. On CUDA it uses the precision and gradient checkpointing this trainer
    chooses for ``dtype`` (grpo_trainer.grpo_config.precision), so the comparison is like for like."""
    from datasets import load_dataset
    from grpo_trainer.grpo_config import precision
    from transformers import AutoTokenizer, TrainerCallback
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    mixed = precision(dtype, lora=False, cuda=cuda)
    durations: list[float] = []

    class Timer(TrainerCallback):  # type: ignore[misc]
        started = 0.0

        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            durations.append(time.perf_counter() - self.started)

    def reward(prompts: list[Any], completions: list[Any], **_: Any) -> list[float | None]:
        out: list[float | None] = []
        for completion in completions:
            try:
                out.append(reward_value(completion))
            except FormatFailure:
                out.append(-1.0)
        return out

    args = GRPOConfig(
        output_dir=str(out),
        num_generations=GROUP,
        per_device_train_batch_size=GROUP,
        gradient_accumulation_steps=PROMPTS,
        max_steps=steps,
        max_completion_length=completion_tokens,
        learning_rate=LR,
        seed=SEED,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=not cuda,
        bf16=mixed.bf16,
        fp16=mixed.fp16,
        gradient_checkpointing=cuda,
        disable_tqdm=True,
        model_init_kwargs={"dtype": mixed.load_dtype},
    )
    trainer = GRPOTrainer(
        model=str(model),
        reward_funcs=[reward],
        args=args,
        train_dataset=load_dataset("json", data_files=str(data), split="train"),
        processing_class=AutoTokenizer.from_pretrained(model),
        callbacks=[Timer()],
    )
    trainer.train()
    return durations


def this_trainer(
    model: Path, data: Path, work: Path, steps: int, metric_url: str
) -> tuple[list[float], float]:
    config = {
        "job": {"namespace": "bench", "name": "bench"},
        "model": {"name": str(model), "dtype": "float32"},
        "dataset": {"train": f"file://{data}"},
        "grpo": {
            "groupSize": GROUP,
            "promptsPerStep": PROMPTS,
            "steps": steps,
            "learningRate": LR,
            "maxCompletionLength": COMPLETION_TOKENS,
            "seed": SEED,
        },
        "trainer": {"perDeviceBatchSize": GROUP},
        "generation": {"backend": "transformers"},
        "metric": {"url": metric_url, "batchSize": 32, "concurrency": 4},
        # The final step always checkpoints; no periodic checkpoint falls inside the measurement.
        "checkpoints": {"dir": str(work / "ckpt"), "everySteps": 1_000_000, "keepLast": 1},
        "outputDir": str(work / "out"),
        "metricsPort": free_port(),
    }
    path = work / "trainer.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "RANK", "WORLD_SIZE")}
    env.update(
        GRPO_CONFIG=str(path), HF_HUB_OFFLINE="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1")
    )
    subprocess.run([sys.executable, "-m", "grpo_trainer"], cwd=REPO, env=env, check=True, capture_output=True)
    records = [json.loads(line) for line in (work / "out" / "metrics.jsonl").read_text().splitlines()]
    metric_total = records[-1]["metric_seconds"]
    return [r["step_seconds"] for r in records], metric_total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3, help="first steps left out of the medians")
    options = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    from grpo_trainer.tiny import build

    with tempfile.TemporaryDirectory(prefix="grpo-bench-") as tmp:
        work = Path(tmp)
        model = build(work / "model")
        data = work / "train.jsonl"
        write_data(data)
        bare = bare_trl(model, data, work / "bare", options.steps)
        with MetricServer(http_metric) as metric:
            ours, metric_seconds = this_trainer(model, data, work, options.steps, metric.url)

    w = options.warmup
    bare_median = statistics.median(bare[w:])
    ours_median = statistics.median(ours[w:])
    share = metric_seconds / sum(ours)
    print(
        f"steps measured: {len(bare) - w} (after {w} warm-up), B={PROMPTS} G={GROUP} completion<={COMPLETION_TOKENS} tokens"
    )
    print(f"bare TRL median step:     {bare_median * 1000:8.1f} ms")
    print(f"this trainer median step: {ours_median * 1000:8.1f} ms")
    print(f"step-time ratio (this trainer / bare TRL): {ours_median / bare_median:.2f}")
    print(f"share of step time in remote scoring: {share:.1%} ({metric_seconds:.2f} s of {sum(ours):.2f} s)")


if __name__ == "__main__":
    main()
