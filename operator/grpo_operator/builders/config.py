"""ConfigMap `<job>-config`: the trainer config (trainer.json) rendered from the spec."""

from __future__ import annotations

from grpo_operator.api.trainer_config import TrainerConfig
from grpo_operator.builders.common import (
    CONFIG_KEY,
    Job,
    Manifest,
    config_map_name,
    content_hash,
    generation_host,
    metadata,
    metric_url,
    with_hash,
)
from grpo_operator.settings import OperatorSettings


def trainer_config(job: Job, settings: OperatorSettings) -> TrainerConfig:
    """The config the trainer reads; the vLLM server is the job's `<job>-gen` Service. Every port comes
    from ``settings``, the same values the pods and Services are built with."""
    return TrainerConfig.from_spec(
        job.namespace,
        job.name,
        job.uid,
        job.spec,
        metric_url=metric_url(job),
        generation_host=generation_host(job),
        backend="vllm-server",
        vllm_port=settings.vllm_port,
        weight_sync_port=settings.weight_sync_port,
        metrics_port=settings.trainer_metrics_port,
    )


def trainer_config_text(job: Job, settings: OperatorSettings) -> str:
    return trainer_config(job, settings).dump_json() + "\n"


def config_hash(job: Job, settings: OperatorSettings) -> str:
    """Hash of trainer.json; pods carry it so a config change is a pod change (gang restart)."""
    return content_hash(trainer_config_text(job, settings))


def trainer_config_map(job: Job, settings: OperatorSettings) -> Manifest:
    return with_hash(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata(job, config_map_name(job), "trainer"),
            "data": {CONFIG_KEY: trainer_config_text(job, settings)},
        }
    )
