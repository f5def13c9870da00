"""MLflow and Weights & Biases trackers (spec.tracking.mlflow, spec.tracking.wandb), rank 0 only.

Both report what TensorBoard gets (tracking.py): every number of the step's metrics.jsonl record, the
learning-health diagnosis, sample completions as tables and the resolved configuration. Both continue one run
per job across attempts: MLflow through the run id kept on the job's volume, W&B through a run id derived from
the job's uid. Credentials come from the environment the operator fills from Secret references
(MLFLOW_TRACKING_USERNAME/PASSWORD/TOKEN, WANDB_API_KEY); nothing here reads a Secret.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_operator.api.tracking import TRACKING_STATE_SUBDIR, WANDB_SUBDIR, MlflowSpec, WandbSpec

from grpo_trainer.tracking import SAMPLE_TEXT_LIMIT, TrackingPlan, numbers

log = logging.getLogger("grpo_trainer.tracking")

# The sample columns every tracker's table has, in order (samples.jsonl's keys).
SAMPLE_COLUMNS = ("prompt", "completion", "reward", "advantage", "formatFailure", "answer", "finishReason")

# MLflow's own limits (its REST API refuses beyond them): metrics and params per log_batch call, and the
# length of a param's key and value.
_MLFLOW_BATCH = 1000
_MLFLOW_PARAMS_BATCH = 100
_MLFLOW_KEY_LIMIT = 250
_MLFLOW_VALUE_LIMIT = 6000
_MLFLOW_KEY = re.compile(r"[^\w\-. /]")


def _sample_rows(samples: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    def cell(value: Any) -> Any:
        if isinstance(value, str) and len(value) > SAMPLE_TEXT_LIMIT * 10:
            return value[: SAMPLE_TEXT_LIMIT * 10] + "…"
        return value if value is None or isinstance(value, bool | int | float | str) else json.dumps(value)

    return [[cell(sample.get(column)) for column in SAMPLE_COLUMNS] for sample in samples]


def flat_params(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """trainer.json as MLflow parameters: nested keys joined with '.', lists and nulls as JSON text."""
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from flat_params(value, f"{name}.")
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            yield _MLFLOW_KEY.sub("_", name)[:_MLFLOW_KEY_LIMIT], text[:_MLFLOW_VALUE_LIMIT]


class MlflowTracker:
    """One MLflow run per job on the tracking server of spec.tracking.mlflow."""

    name = "MLflow"

    def __init__(self, spec: MlflowSpec, plan: TrackingPlan, resumed_step: int) -> None:
        # A tracking server that is down must not stall a step for minutes: MLflow's default is 7 retries
        # with exponential backoff and a 120 s timeout. The pod's own variables win.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        assert spec.tracking_uri is not None  # enabled MLflow has one (MlflowSpec's validator)
        self.client = MlflowClient(tracking_uri=spec.tracking_uri)
        experiment_name = spec.experiment or plan.namespace
        experiment = self.client.get_experiment_by_name(experiment_name)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            try:
                experiment_id = self.client.create_experiment(experiment_name)
            except MlflowException:
                # Another job of the namespace created it first.
                found = self.client.get_experiment_by_name(experiment_name)
                if found is None:
                    raise
                experiment_id = found.experiment_id
        self._id_file = plan.output_dir / TRACKING_STATE_SUBDIR / "mlflow-run-id"
        self.run_id = self._existing_run(experiment_id)
        self.continued = self.run_id is not None
        if self.run_id is None:
            run = self.client.create_run(
                experiment_id,
                run_name=spec.run_name or plan.name,
                tags={
                    "grpo.dev/namespace": plan.namespace,
                    "grpo.dev/job": plan.name,
                    "grpo.dev/uid": plan.uid,
                },
            )
            self.run_id = run.info.run_id
            self._id_file.parent.mkdir(parents=True, exist_ok=True)
            self._id_file.write_text(self.run_id + "\n")
        else:
            self.client.update_run(self.run_id, status="RUNNING")
            self.client.set_tag(self.run_id, "grpo.dev/resumed-at-step", str(resumed_step))
        log.info(
            "MLflow: %s run %s in experiment %r at %s",
            "continuing" if self.continued else "started",
            self.run_id,
            experiment_name,
            spec.tracking_uri,
        )

    def _existing_run(self, experiment_id: str) -> str | None:
        """The run an earlier attempt of this job logged to, if it is on this server in this experiment."""
        if not self._id_file.is_file():
            return None
        run_id = self._id_file.read_text().strip()
        try:
            run = self.client.get_run(run_id)
        except Exception:
            log.warning(
                "MLflow: the run of an earlier attempt (%s) is not on this server; starting a new one", run_id
            )
            return None
        if run.info.experiment_id != experiment_id or run.info.lifecycle_stage != "active":
            log.warning("MLflow: run %s was moved or deleted; starting a new one", run_id)
            return None
        return run_id

    def configuration(self, trainer_json: str, trl_arguments: str, step: int) -> None:
        from mlflow.entities import Param

        assert self.run_id is not None
        if not self.continued:
            # Parameters are immutable in MLflow: a continued run keeps the first attempt's; the artifacts
            # below always hold this attempt's configuration.
            params = [Param(k, v) for k, v in flat_params(json.loads(trainer_json))]
            for start in range(0, len(params), _MLFLOW_PARAMS_BATCH):
                self.client.log_batch(self.run_id, params=params[start : start + _MLFLOW_PARAMS_BATCH])
        self.client.log_text(self.run_id, trainer_json, "config/trainer.json")
        self.client.log_text(self.run_id, trl_arguments, "config/trl_arguments.json")

    def step(self, step: int, record: Mapping[str, Any], samples: Sequence[Mapping[str, Any]]) -> None:
        from mlflow.entities import Metric

        assert self.run_id is not None
        now = int(time.time() * 1000)
        metrics = [
            Metric(_MLFLOW_KEY.sub("_", name), value, now, step) for name, value in numbers(record).items()
        ]
        for start in range(0, len(metrics), _MLFLOW_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + _MLFLOW_BATCH])
        health = record.get("learning_health")
        if isinstance(health, str):
            self.client.set_tag(self.run_id, "grpo.dev/learning-health", health)
        if samples:
            self._table(samples, f"samples/train/step_{step:06d}.json")

    def validation(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        if samples:
            self._table(samples, f"samples/validation/step_{step:06d}.json")

    def _table(self, samples: Sequence[Mapping[str, Any]], artifact_file: str) -> None:
        assert self.run_id is not None
        rows = _sample_rows(samples)
        columns = {column: [row[i] for row in rows] for i, column in enumerate(SAMPLE_COLUMNS)}
        self.client.log_table(self.run_id, data=columns, artifact_file=artifact_file)

    def close(self) -> None:
        assert self.run_id is not None
        self.client.set_terminated(self.run_id, status="FINISHED")


def wandb_run_id(uid: str, namespace: str, name: str) -> str:
    """The W&B run id every attempt of one job shares: its uid (unique across the cluster's history), or
    namespace and name where the trainer runs without one (a local run)."""
    source = uid or f"{namespace}-{name}"
    return re.sub(r"[^A-Za-z0-9_-]", "-", source)[:64]


class WandbTracker:
    """One W&B run per job: online, or offline files under <outputDir>/wandb for `wandb sync`."""

    name = "W&B"

    def __init__(self, spec: WandbSpec, plan: TrackingPlan, resumed_step: int) -> None:
        if spec.base_url is not None:
            os.environ["WANDB_BASE_URL"] = spec.base_url
        import wandb

        # W&B puts its run directory under <dir>/wandb.
        root = plan.output_dir
        (root / WANDB_SUBDIR).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=spec.project,
            entity=spec.entity,
            name=spec.run_name or plan.name,
            id=wandb_run_id(plan.uid, plan.namespace, plan.name),
            resume="allow",
            mode=spec.mode,
            dir=str(root),
            tags=[plan.namespace],
            # The trainer's own log lines go to the pod log; W&B capturing the console would duplicate them.
            settings=wandb.Settings(console="off", silent=True),
        )
        self._wandb = wandb
        self.resumed_step = resumed_step
        log.info("W&B: run %s (%s) in %s", self.run.id, spec.mode, Path(self.run.dir).parent)

    def configuration(self, trainer_json: str, trl_arguments: str, step: int) -> None:
        config = json.loads(trainer_json)
        config["trl"] = json.loads(trl_arguments)
        self.run.config.update(config, allow_val_change=True)  # type: ignore[no-untyped-call]

    def step(self, step: int, record: Mapping[str, Any], samples: Sequence[Mapping[str, Any]]) -> None:
        data: dict[str, Any] = dict(numbers(record))
        health = record.get("learning_health")
        if isinstance(health, str):
            self.run.summary["learning_health"] = health
        if samples:
            data["samples/train"] = self._wandb.Table(
                columns=list(SAMPLE_COLUMNS), data=_sample_rows(samples)
            )
        self.run.log(data, step=step)

    def validation(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        if samples:
            table = self._wandb.Table(columns=list(SAMPLE_COLUMNS), data=_sample_rows(samples))
            self.run.log({"samples/validation": table}, step=step)

    def close(self) -> None:
        self.run.finish()
