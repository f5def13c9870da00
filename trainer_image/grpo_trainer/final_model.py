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
