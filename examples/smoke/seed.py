"""Prepares the smoke job's volume: a tiny model at models/smoke and prompts at data/*.jsonl.

Runs inside the cluster in the trainer image (the smoke script's `smoke-seed` Job mounts the job's
claim at /workspace and this file from a ConfigMap), so no model hub and no upload is needed:

    python seed.py /workspace

The model is grpo_trainer.tiny's randomly initialised Qwen2 with a character tokenizer, made wide
enough (hidden 256, 4 heads: head size 64) for vLLM's attention kernels. The task is the demo's: the
metric (examples/tiny/metric.py) rewards the share of the character "a" in the completion.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grpo_trainer.tiny import build

TARGET = "a"
HIDDEN_SIZE = 256


def write_prompts(path: Path, rows: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for i in range(rows):
            handle.write(json.dumps({"prompt": f"q{i % 10}{chr(98 + i % 20)}:", "answer": TARGET}) + "\n")


def seed(volume: Path) -> None:
    model = volume / "models" / "smoke"
    if not (model / "config.json").exists():  # a rerun keeps the model it trained from
        build(model, hidden_size=HIDDEN_SIZE)
    write_prompts(volume / "data" / "train.jsonl", 64)
    write_prompts(volume / "data" / "validation.jsonl", 8)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python seed.py VOLUME_DIR")
    seed(Path(sys.argv[1]))
    print(f"seeded {sys.argv[1]}: models/smoke, data/train.jsonl, data/validation.jsonl")
