"""The final model in the dtype the job serves.

Full fine-tuning in bfloat16 or float16 trains fp32 master weights, and HF Trainer saves the weights as it
holds them. Checkpoints keep them in fp32 (a resume must continue from the masters, not from their 16-bit
rounding); the final model is what a user exports and serves, so it is rewritten in ``model.dtype``: half
the bytes, and the dtype its config.json names is the one vLLM and transformers then load it in."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

# safetensors metadata HF writes; transformers refuses to load shards without {"format": "pt"}.
SHARD_METADATA = {"format": "pt"}
INDEX_FILE = "model.safetensors.index.json"


def cast_saved_model(directory: Path, dtype: str) -> int:
    """Rewrites the full-model safetensors shards in ``directory`` with their floating-point tensors in
    ``dtype``, one shard at a time (never the whole model in memory), and names ``dtype`` in config.json.
    LoRA adapter files are left as PEFT wrote them. Returns the bytes of tensor data after the cast."""
    import torch
    from safetensors.torch import load_file, save_file

    target = getattr(torch, dtype)
    total = 0
    shards = sorted(p for p in directory.glob("*.safetensors") if not p.name.startswith("adapter_"))
    for shard in shards:
        tensors = load_file(str(shard))
        cast = {
            name: t.to(target) if t.is_floating_point() and t.dtype != target else t
            for name, t in tensors.items()
        }
        total += sum(t.numel() * t.element_size() for t in cast.values())
        if any(cast[name] is not tensors[name] for name in tensors):
            partial = shard.with_name(shard.name + ".partial")
            save_file(cast, str(partial), metadata=SHARD_METADATA)
            os.replace(partial, shard)
    if not shards:
        return 0
    _rewrite_json(directory / "config.json", lambda config: config.update(dtype=dtype))
    _rewrite_json(
        directory / INDEX_FILE, lambda index: index.setdefault("metadata", {}).update(total_size=total)
    )
    return total


def _rewrite_json(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    if not path.is_file():
        return
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(partial, path)


def save_gathered_model(trainer: Any, directory: Path, dtype: str, *, writer: bool) -> int:
    """Collective (every rank calls it): the model's full tensors, gathered from their FSDP2 shards one at a
    time and cast to ``dtype``, written by the ``writer`` rank as the weight sync writes them
    (weight_sync.write_shards: files of at most SHARD_BYTES) with their index, beside config.json (naming
    ``dtype``), the generation config and the tokenizer: an ordinary Hugging Face model directory that
    transformers and vLLM load. No rank ever holds the whole model: the writer holds one file's tensors at
    most. Returns the bytes of tensor data written (0 on the other ranks)."""
    from grpo_trainer.weight_sync import served_tensors, write_shards

    model = trainer.accelerator.unwrap_model(trainer.model)
    gathered = (
        (name, tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor)
        for name, tensor in model.state_dict().items()
    )
    if not writer:
        for _ in gathered:  # take part in each gather
            pass
        return 0
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.safetensors"):
        stale.unlink()
    weight_map: dict[str, str] = {}
    total = write_shards(served_tensors(gathered, dtype), directory, weight_map)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    config = model.config
    config.dtype = dtype
    config.save_pretrained(str(directory))
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(str(directory))
    processing = getattr(trainer, "processing_class", None)
    if processing is not None:
        processing.save_pretrained(str(directory))
    return total
