"""spec.tracking: experiment trackers the trainer reports to, besides metrics.jsonl, Prometheus and status.

Each tracker is a block of its own (tensorBoard, mlflow, wandb). A platform may set default blocks (Helm
``jobDefaults.tracking``): a job that leaves a tracker's block unset gets the platform's block, a job that
sets it gets exactly its own, and ``enabled: false`` turns a tracker off, the platform's default included.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import Field, model_validator

from grpo_operator.api.base import ApiModel, CelRule, CelRules
from grpo_operator.api.field_types import DNS1123_SUBDOMAIN_PATTERN, NO_SPACE_PATTERN
from grpo_operator.api.model_spec import SecretKeySelector

# Under the trainer's outputDir (on the job's volume): one directory of event files per job, shared by its
# attempts (a resumed attempt purges the steps it redoes).
TENSORBOARD_SUBDIR = "tensorboard"
# Under outputDir: W&B's run directories (offline runs stay there for `wandb sync`), and the trackers'
# bookkeeping that lets every attempt of a job continue the same tracker run (the MLflow run id).
WANDB_SUBDIR = "wandb"
TRACKING_STATE_SUBDIR = "tracking"

# The keys of spec.tracking.mlflow.credentialsSecret the trainer reads, as the MLflow client's own variables:
# basic auth (a tracking server started with --app-name basic-auth) or a bearer token (Databricks, proxies).
MLFLOW_CREDENTIAL_KEYS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
WANDB_API_KEY_ENV = "WANDB_API_KEY"

URL_PATTERN = r"^https?://[^ \t\r\n]+$"


class TensorBoardSpec(ApiModel):
    """TensorBoard event files on the job's volume."""

    enabled: bool = Field(
        default=False,
        description="Trainer rank 0 writes TensorBoard event files to <outputDir>/tensorboard on the job's "
        "volume (/workspace/output/tensorboard): every step's figures as scalars (those of metrics.jsonl, "
        "TRL's loss, KL, entropy, clip ratios, learning rate), the learning-health diagnosis, sample "
        "completions as a table, and the resolved configuration (trainer.json and TRL's arguments) as text.",
    )


class MlflowSpec(ApiModel):
    """An MLflow tracking server the trainer logs a run to."""

    class Rules(CelRules):
        uri_when_enabled = CelRule(
            "!self.enabled || has(self.trackingUri)",
            "spec.tracking.mlflow needs trackingUri, the tracking server's URL (e.g. "
            "http://mlflow.mlflow.svc:5000), or enabled: false to turn the platform's MLflow default off",
            ".trackingUri",
        )

    enabled: bool = Field(
        default=True,
        description="false turns MLflow off for this job, the platform's default (Helm "
        "jobDefaults.tracking.mlflow) included.",
    )
    tracking_uri: Annotated[str, Field(max_length=2048, pattern=URL_PATTERN)] | None = Field(
        default=None,
        description="URL of the MLflow tracking server (http or https), reachable from the trainer pods. The "
        "server must serve artifacts (mlflow server's default, --serve-artifacts) for the configuration and "
        "sample tables.",
    )
    experiment: Annotated[str, Field(min_length=1, max_length=500)] | None = Field(
        default=None,
        description="Experiment the run is logged under; created when missing. Unset: the job's namespace, "
        "so a team's runs are compared in one experiment.",
    )
    run_name: Annotated[str, Field(min_length=1, max_length=250)] | None = Field(
        default=None,
        description="Name of the run. Unset: the job's name. Every attempt of the job (gang restarts, "
        "resumes) continues the same run.",
    )
    credentials_secret: Annotated[str, Field(max_length=253, pattern=DNS1123_SUBDOMAIN_PATTERN)] | None = (
        Field(
            default=None,
            description="Name of a Secret in the job's namespace holding any of MLFLOW_TRACKING_USERNAME, "
            "MLFLOW_TRACKING_PASSWORD (basic auth) and MLFLOW_TRACKING_TOKEN (bearer token); each key present "
            "becomes that variable in trainer rank 0 only, resolved by the kubelet.",
        )
    )

    @model_validator(mode="after")
    def _uri_when_enabled(self) -> MlflowSpec:
        if self.enabled and self.tracking_uri is None:
            raise self.Rules.uri_when_enabled.violation()
        return self


class WandbSpec(ApiModel):
    """Weights & Biases: a hosted or self-hosted server, or offline run files on the job's volume."""

    class Rules(CelRules):
        project_when_enabled = CelRule(
            "!self.enabled || has(self.project)",
            "spec.tracking.wandb needs project, the W&B project the run is logged to, or enabled: false to "
            "turn the platform's W&B default off",
            ".project",
        )
        key_when_online = CelRule(
            "!self.enabled || self.mode == 'offline' || has(self.apiKeySecretRef)",
            "spec.tracking.wandb with mode online needs apiKeySecretRef: a Secret key holding the W&B API "
            "key (kubectl create secret generic wandb --from-literal=apiKey=...), or mode: offline to write "
            "the run to the job's volume for a later `wandb sync`",
            ".apiKeySecretRef",
        )

    enabled: bool = Field(
        default=True,
        description="false turns W&B off for this job, the platform's default (Helm "
        "jobDefaults.tracking.wandb) included.",
    )
    project: Annotated[str, Field(min_length=1, max_length=128, pattern=NO_SPACE_PATTERN)] | None = Field(
        default=None, description="W&B project of the run."
    )
    entity: Annotated[str, Field(min_length=1, max_length=128, pattern=NO_SPACE_PATTERN)] | None = Field(
        default=None, description="W&B entity (team or user). Unset: the API key's default entity."
    )
    run_name: Annotated[str, Field(min_length=1, max_length=128)] | None = Field(
        default=None,
        description="Display name of the run. Unset: the job's name. Every attempt of the job continues "
        "the same run (its id is derived from the job's uid).",
    )
    mode: Literal["online", "offline"] = Field(
        default="online",
        description="online: log to the W&B server as the job runs. offline (air-gapped clusters): write "
        "the run to <outputDir>/wandb on the job's volume; copy it out with `kubectl grpo export JOB "
        "--wandb DIR` and upload it with `wandb sync DIR/offline-run-*`.",
    )
    api_key_secret_ref: SecretKeySelector | None = Field(
        default=None,
        description="The Secret key holding the W&B API key (variable WANDB_API_KEY, trainer rank 0 only). "
        "Required online.",
    )
    base_url: Annotated[str, Field(max_length=2048, pattern=URL_PATTERN)] | None = Field(
        default=None, description="URL of a self-hosted W&B server. Unset: W&B's cloud."
    )

    @model_validator(mode="after")
    def _complete_when_enabled(self) -> WandbSpec:
        if self.enabled and self.project is None:
            raise self.Rules.project_when_enabled.violation()
        if self.enabled and self.mode == "online" and self.api_key_secret_ref is None:
            raise self.Rules.key_when_online.violation()
        return self


class TrackingSpec(ApiModel):
    """Experiment trackers."""

    tensor_board: TensorBoardSpec | None = Field(
        default=None, description="TensorBoard event files on the job's volume."
    )
    mlflow: MlflowSpec | None = Field(
        default=None,
        description="An MLflow tracking server: step figures as metrics, the resolved configuration as "
        "parameters and an artifact, sample completions as tables.",
    )
    wandb: WandbSpec | None = Field(
        default=None,
        description="Weights & Biases, online or offline: step figures, the resolved configuration as the "
        "run's config, sample completions as tables.",
    )

    def tensorboard_enabled(self) -> bool:
        return self.tensor_board is not None and self.tensor_board.enabled

    def mlflow_enabled(self) -> MlflowSpec | None:
        return self.mlflow if self.mlflow is not None and self.mlflow.enabled else None

    def wandb_enabled(self) -> WandbSpec | None:
        return self.wandb if self.wandb is not None and self.wandb.enabled else None

    def any_enabled(self) -> bool:
        return (
            self.tensorboard_enabled()
            or self.mlflow_enabled() is not None
            or self.wandb_enabled() is not None
        )

    def merged_over(self, defaults: Mapping[str, object]) -> TrackingSpec:
        """This spec with each tracker block it leaves unset taken whole from ``defaults`` (the platform's
        spec.tracking, camelCase or Python names). Blocks are not merged field by field: a job that names a
        tracker says everything about it, so a platform's credentials never leak into a job's own server."""
        fallback = TrackingSpec.model_validate(dict(defaults))
        update = {
            name: getattr(fallback, name)
            for name in TrackingSpec.model_fields
            if getattr(self, name) is None and getattr(fallback, name) is not None
        }
        return self.model_copy(update=update, deep=True)


def resolved_tracking(own: TrackingSpec | None, defaults: Mapping[str, object]) -> TrackingSpec | None:
    """A job's trackers with the platform's defaults (Helm jobDefaults.tracking) under them; None when
    neither sets any."""
    if not defaults:
        return own
    return (own or TrackingSpec()).merged_over(defaults)
