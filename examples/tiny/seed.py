"""Prepares the tiny demo job's volume: a tiny model at models/tiny and prompts at data/*.jsonl.

No model hub is reachable on the demo machine, so the model is a small randomly initialised Qwen2
with a character tokenizer (grpo_trainer.tiny). Run it against the directory that backs the job's
claim (the demo does) or, on a real cluster, a pod that mounts the claim at /workspace:

    python examples/tiny/seed.py /workspace
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grpo_trainer.tiny import build

TARGET = "a"


def write_prompts(path: Path, rows: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for i in range(rows):
            prompt = f"q{i % 10}{chr(98 + i % 20)}:"
            handle.write(json.dumps({"prompt": prompt, "answer": TARGET}) + "\n")


def seed(volume: Path) -> None:
    if not (volume / "models" / "tiny" / "config.json").exists():
        build(volume / "models" / "tiny")
    write_prompts(volume / "data" / "train.jsonl", 64)
    write_prompts(volume / "data" / "validation.jsonl", 8)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python examples/tiny/seed.py VOLUME_DIR")
    seed(Path(sys.argv[1]))
    print(f"seeded {sys.argv[1]}: models/tiny, data/train.jsonl, data/validation.jsonl")
