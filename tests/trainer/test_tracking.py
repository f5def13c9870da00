"""spec.tracking on a real trainer process: TensorBoard's event files on the job's volume (read back with
TensorBoard's own reader), a real MLflow tracking server and W&B in offline mode each hold what metrics.jsonl
holds, step by step, plus the learning-health diagnosis, sample completions and the resolved configuration."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from grpo_metric import MetricServer

from tests.harness.ports import free_port
from tests.trainer import wandb_records
from tests.trainer.toy import read_jsonl, start_trainer, trainer_config

pytestmark = pytest.mark.trainer


def test_tensorboard_event_files_hold_every_step_samples_and_the_resolved_configuration(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer
) -> None:
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    config = trainer_config(tmp_path, tiny_model, toy_metric.url, steps=3, every_steps=3, validation_every=3)
    raw = json.loads(config.read_text())
    raw["tracking"] = {"tensorBoard": {"enabled": True}}
    raw["grpo"]["preset"] = "dr-grpo"
    config.write_text(json.dumps(raw))
    process = start_trainer(config, tmp_path / "trainer.log")
    assert process.wait(timeout=600) == 0, (tmp_path / "trainer.log").read_text()[-3000:]

    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    logdir = tmp_path / "out" / "tensorboard"
    events = event_accumulator.EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    # The metric's rewards, GRPO's own bookkeeping, TRL's figures and the update check, as metrics.jsonl.
    for name in ("reward_mean", "zero_std_group_ratio", "loss", "learning_rate", "updated_fraction"):
        assert f"grpo/{name}" in scalars, sorted(scalars)
        points = events.Scalars(f"grpo/{name}")
        assert [p.step for p in points] == [1, 2, 3]
        assert [p.value for p in points] == pytest.approx([r[name] for r in records], rel=1e-5)
    assert "grpo/validation_mean" in scalars

    texts = {tag: events.Tensors(tag) for tag in events.Tags()["tensors"]}

    def text(tag: str) -> str:
        return "\n".join(t.tensor_proto.string_val[0].decode() for t in texts[f"{tag}/text_summary"])

    # The resolved configuration: the preset's knobs filled in, and TRL's own arguments.
    assert '"scaleRewards": "none"' in text("config/trainer.json")
    assert '"loss_type": "dr_grpo"' in text("config/trl_arguments")
    assert "| prompt | completion | reward |" in text("samples/train")
    assert "| prompt | completion | reward |" in text("samples/validation")
    assert text("grpo/learning_health").split("\n") == [r["learning_health"] for r in records]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real MLflow tracking server (SQLite store, artifacts served by the server, as `mlflow server`
    deploys by default)."""
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    log = (root / "server.log").open("wb")
    process = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("mlflow")),
            "server",
            "--host=127.0.0.1",
            f"--port={port}",
            f"--backend-store-uri=sqlite:///{root / 'mlflow.db'}",
            f"--artifacts-destination={root / 'artifacts'}",
            "--workers=1",
        ],
        stdout=log,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert process.poll() is None, (root / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "mlflow server did not answer /health in 120 s"
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_mlflow_and_offline_wandb_get_every_step_samples_and_configuration_and_a_resume_continues_the_run(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer, mlflow_server: str
) -> None:
    """One job reporting to a real MLflow server and to W&B offline: each holds what metrics.jsonl holds,
    step by step, the resolved configuration and the sample tables. A second attempt resuming from step 2
    continues the same MLflow run and the same W&B run id, and MLflow's run ends FINISHED."""
    from mlflow.tracking import MlflowClient

    config = trainer_config(tmp_path, tiny_model, toy_metric.url, steps=3, every_steps=2, keep_last=2)
    raw = json.loads(config.read_text())
    raw["job"]["uid"] = "0d6f1c2e-5a7b-4c1d-9e8f-000000000001"
    raw["tracking"] = {
        "mlflow": {"trackingUri": mlflow_server, "experiment": "team-a"},
        "wandb": {"project": "grpo-tests", "mode": "offline"},
    }
    config.write_text(json.dumps(raw))
    process = start_trainer(config, tmp_path / "attempt-1.log", WANDB_MODE="offline")
    assert process.wait(timeout=600) == 0, (tmp_path / "attempt-1.log").read_text()[-3000:]
    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    step_1_samples = [s for s in read_jsonl(tmp_path / "out" / "samples.jsonl") if s["step"] == 1]

    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("team-a")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "toy" and run.info.status == "FINISHED"
    for name in ("reward_mean", "loss", "learning_rate", "updated_fraction"):
        history = client.get_metric_history(run.info.run_id, name)
        assert [m.step for m in history] == [1, 2, 3], name
        assert [m.value for m in history] == pytest.approx([r[name] for r in records], rel=1e-6)
    assert run.data.params["grpo.groupSize"] == "8"
    assert run.data.tags["grpo.dev/learning-health"] == records[-1]["learning_health"]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "samples/train")}
    assert "samples/train/step_000001.json" in artifacts
    table = json.loads(_artifact(client, run.info.run_id, "samples/train/step_000001.json", tmp_path))
    assert table["columns"][:3] == ["prompt", "completion", "reward"]
    assert [row[1] for row in table["data"]] == [s["completion"] for s in step_1_samples]
    trainer_json = _artifact(client, run.info.run_id, "config/trainer.json", tmp_path)
    assert json.loads(trainer_json)["grpo"]["groupSize"] == 8

    (wandb_file,) = (tmp_path / "out" / "wandb").glob("offline-run-*/run-*.wandb")
    assert wandb_file.name == "run-0d6f1c2e-5a7b-4c1d-9e8f-000000000001.wandb"
    logged = wandb_records.history(wandb_file)
    assert sorted(logged) == [1, 2, 3]
    assert [logged[s]["reward_mean"] for s in (1, 2, 3)] == pytest.approx([r["reward_mean"] for r in records])
    assert logged[1]["samples/train/_type"] == "table-file"
    assert logged[1]["samples/train/nrows"] == len(step_1_samples)
    assert wandb_records.config(wandb_file)["grpo"]["groupSize"] == 8
    assert wandb_records.summary(wandb_file)["learning_health"] == records[-1]["learning_health"]

    # Attempt 2 resumes from step 2's checkpoint and redoes step 3.
    (step_2,) = (tmp_path / "ckpt").glob("step-2")
    process = start_trainer(
        config,
        tmp_path / "attempt-2.log",
        WANDB_MODE="offline",
        GRPO_TRAINER_ATTEMPT="2",
        RESUME_FROM=str(step_2),
    )
    assert process.wait(timeout=600) == 0, (tmp_path / "attempt-2.log").read_text()[-3000:]
    (again,) = client.search_runs([experiment.experiment_id])
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    assert again.data.tags["grpo.dev/resumed-at-step"] == "2"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "reward_mean")] == [1, 2, 3, 3]
    second = sorted((tmp_path / "out" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(second) == 2 and {p.name for p in second} == {wandb_file.name}


def _artifact(client: Any, run_id: str, path: str, workdir: Path) -> str:
    return Path(client.download_artifacts(run_id, path, str(workdir))).read_text()
