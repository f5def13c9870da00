"""The volume transport's writer: every tensor lands in a shard of bounded size, as a copy taken when it
arrived (TRL changes a LoRA model's merged weights back in place once the iteration ends, and a tied
embedding shares its storage with the output layer)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.trainer


def test_shards_are_bounded_and_hold_copies_taken_on_arrival(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from grpo_trainer import weight_sync
    from safetensors.torch import load_file

    monkeypatch.setattr(weight_sync, "SHARD_BYTES", 4 * 100)  # 100 float32 values per shard
    shared = torch.ones(10, 10)
    tensors = {"embed.weight": shared, "lm_head.weight": shared, "layer.weight": torch.arange(60.0)}

    def merged_then_unmerged() -> Iterator[tuple[str, torch.Tensor]]:
        yield from tensors.items()
        shared.zero_()  # what unmerge_adapter does to the weights once the walk is over

    written = weight_sync.write_shards(merged_then_unmerged(), tmp_path / "sync")
    shards = sorted((tmp_path / "sync").glob("*.safetensors"))
    loaded = {k: v for shard in shards for k, v in load_file(str(shard)).items()}
    assert written == 4 * (100 + 100 + 60)
    assert len(shards) == 3, [s.name for s in shards]  # 100, 100 and 60 values: none fits beside another
    assert set(loaded) == set(tensors)
    assert bool((loaded["embed.weight"] == 1).all()) and bool((loaded["lm_head.weight"] == 1).all())
    assert torch.equal(loaded["layer.weight"], torch.arange(60.0))
