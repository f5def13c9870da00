"""Each weight sync's record (grpo_trainer.steps.SyncReporter): a line in weight_syncs.jsonl whatever the
transport, and status.servedModel.weightSync only with a transport the API's status accepts, so that a
transport the API does not name yet never gets the status patch refused."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, get_args

import pytest
from grpo_trainer.steps import Reporting, SyncReporter
from grpo_trainer.weight_sync import ProbeResult, SyncReport


class Status:
    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    def update(self, body: dict[str, Any]) -> None:
        self.patches.append(body)


def api_transports() -> set[str]:
    from grpo_operator.api.status import ServedModelStatus

    annotation = ServedModelStatus.model_fields["weight_sync"].annotation
    return {value for arg in get_args(annotation) for value in get_args(arg) if isinstance(value, str)}


@pytest.mark.parametrize("transport", ["volume", "nccl", "colocate", "a-later-transport"])
def test_every_transport_is_recorded_and_the_status_names_only_the_apis_ones(
    tmp_path: Path, transport: str
) -> None:
    in_status = transport in api_transports()
    status = Status()
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=4))
    reporting = Reporting(metrics=None, status=status)  # type: ignore[arg-type]
    reporter = SyncReporter(trainer, reporting, transport, tmp_path / "syncs.jsonl")
    reporter(SyncReport(0.25, ProbeResult(0.001, 0.003, 12)))
    record = json.loads((tmp_path / "syncs.jsonl").read_text())
    assert record == {
        "step": 4,
        "transport": transport,
        "seconds": 0.25,
        "logprob_diff": 0.001,
        "max_logprob_diff": 0.003,
        "in_sync": True,
    }
    served = status.patches[-1]["servedModel"]
    assert ("weightSync" in served) == in_status and served["inSync"] is True
    if in_status:
        assert served["weightSync"] == transport


@pytest.mark.parametrize("weights", ["adapter", "model"])
def test_a_sync_that_wrote_files_records_its_bytes_and_what_they_carried(
    tmp_path: Path, weights: str
) -> None:
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=2))
    reporting = Reporting(metrics=None, status=Status())  # type: ignore[arg-type]
    reporter = SyncReporter(trainer, reporting, "volume", tmp_path / "syncs.jsonl")
    reporter(SyncReport(0.5, None, bytes=28_672, weights=weights))
    record = json.loads((tmp_path / "syncs.jsonl").read_text())
    assert record == {"step": 2, "transport": "volume", "seconds": 0.5, "bytes": 28_672, "weights": weights}
