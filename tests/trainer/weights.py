"""Reading saved weights and comparing them: how much of a model one run moved, and in which direction.

Shared by the trainer tests at production numerics and bench/gpu_check.py's precision check."""

from __future__ import annotations

from pathlib import Path

import torch


def load_weights(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors files in ``directory``, in float64 (so a comparison never rounds)."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(directory.glob("*.safetensors")):
        tensors.update({k: v.to(torch.float64) for k, v in load_file(str(shard)).items()})
    return tensors


def saved_dtypes(directory: Path) -> set[str]:
    from safetensors import safe_open

    dtypes: set[str] = set()
    for shard in sorted(directory.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as handle:
            dtypes |= {str(handle.get_slice(key).get_dtype()) for key in handle.keys()}  # noqa: SIM118
    return dtypes


def changed_fraction(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per tensor, the fraction of its elements that differ at all."""
    return {name: float((after[name] != w).double().mean()) for name, w in before.items()}


def changed_overall(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    fractions = changed_fraction(before, after)
    total = sum(t.numel() for t in before.values())
    return sum(before[n].numel() * f for n, f in fractions.items()) / total


def update_cosine(
    start: dict[str, torch.Tensor],
    end: dict[str, torch.Tensor],
    reference_start: dict[str, torch.Tensor],
    reference_end: dict[str, torch.Tensor],
) -> tuple[float, float]:
    """Cosine and norm ratio of the update start->end against the reference run's update."""

    def delta(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([(b[name] - a[name]).flatten() for name in sorted(a)])

    ours, reference = delta(start, end), delta(reference_start, reference_end)
    cosine = float(torch.nn.functional.cosine_similarity(ours, reference, dim=0))
    return cosine, float(ours.norm() / reference.norm())
