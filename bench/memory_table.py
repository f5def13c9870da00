"""The table of docs/trainer.md "Memory planning": for Qwen2.5 1.5B-32B and Llama-3-70B, the fewest GPUs
of 80 GB (H100/A100, 81,559 MiB as CUDA reports it) and 141 GB (H200, 143,771 MiB) that the trainer's
memory plan (trainer_image/grpo_trainer/memory_plan.py) fits each way of training on.

    .venv/bin/python bench/memory_table.py            # prints the markdown table
    .venv/bin/python bench/memory_table.py --batch 2 --completion 2048

Pure arithmetic from the models' config.json figures (written out below): no download, no GPU. "—" means
no GPU count fits (plain DDP holds everything on every GPU, so it fits on one GPU or on none).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator

from grpo_trainer.memory_plan import JobShape, ModelShape, min_gpus

MIB = 1024**2
GPUS = {"80 GB": 81_559 * MIB, "141 GB": 143_771 * MIB}

# config.json figures of the models (Hugging Face Hub, Qwen/Qwen2.5-*-Instruct and meta-llama/Meta-Llama-3-70B).
MODELS: dict[str, dict[str, object]] = {
    "Qwen2.5-1.5B": {
        "model_type": "qwen2",
        "vocab_size": 151936,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    },
    "Qwen2.5-7B": {
        "model_type": "qwen2",
        "vocab_size": 152064,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "tie_word_embeddings": False,
    },
    "Qwen2.5-14B": {
        "model_type": "qwen2",
        "vocab_size": 152064,
        "hidden_size": 5120,
        "intermediate_size": 13824,
        "num_hidden_layers": 48,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
    },
    "Qwen2.5-32B": {
        "model_type": "qwen2",
        "vocab_size": 152064,
        "hidden_size": 5120,
        "intermediate_size": 27648,
        "num_hidden_layers": 64,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
    },
    "Llama-3-70B": {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
    },
}

# The ways of training the table compares: name -> the JobShape fields that make it.
MODES: dict[str, dict[str, object]] = {
    "DDP full FT": {"sharding": "none"},
    "FSDP full FT": {"sharding": "fsdp"},
    "FSDP + cpuOffload": {"sharding": "fsdp", "optimizer_offload": True},
    "LoRA r=16 (DDP)": {"lora": True, "lora_rank": 16},
}


def cell(model: ModelShape, job: JobShape, gpu_bytes: int) -> str:
    # LoRA runs as DDP only (the API refuses LoRA with FSDP): "—" where its frozen base does not fit one GPU.
    plan = min_gpus(model, job, gpu_bytes)
    return "—" if plan is None else str(plan.job.world_size)


def rows(base: JobShape) -> Iterator[str]:
    header = ["Model", "Parameters", "GPU", *MODES]
    yield "| " + " | ".join(header) + " |"
    yield "|" + "---|" * len(header)
    for name, config in MODELS.items():
        model = ModelShape.from_config(config)
        for gpu, gpu_bytes in GPUS.items():
            cells = [name, f"{model.parameter_count() / 1e9:.2f}B", gpu]
            for fields in MODES.values():
                cells.append(cell(model, dataclasses.replace(base, **fields), gpu_bytes))  # type: ignore[arg-type]
            yield "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=4, help="spec.trainer.perDeviceBatchSize (4)")
    parser.add_argument("--prompt", type=int, default=512, help="grpo.maxPromptLength (512)")
    parser.add_argument("--completion", type=int, default=1024, help="grpo.maxCompletionLength (1024)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    args = parser.parse_args(argv)
    base = JobShape(
        dtype=args.dtype,
        per_device_batch_size=args.batch,
        max_prompt_length=args.prompt,
        max_completion_length=args.completion,
        gradient_checkpointing=True,
    )
    for line in rows(base):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
