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


def trainer_config(job: Job) -> TrainerConfig:
    """The config the trainer reads; the vLLM server is the job's `<job>-gen` Service."""
    return TrainerConfig.from_spec(
        job.namespace,
        job.name,
        job.uid,
        job.spec,
        metric_url=metric_url(job),
        generation_host=generation_host(job),
        backend="vllm-server",
    )


def trainer_config_text(job: Job) -> str:
    return trainer_config(job).dump_json() + "\n"


def config_hash(job: Job) -> str:
    """Hash of trainer.json; pods carry it so a config change is a pod change (gang restart)."""
    return content_hash(trainer_config_text(job))


def trainer_config_map(job: Job) -> Manifest:
    return with_hash(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata(job, config_map_name(job), "trainer"),
            "data": {CONFIG_KEY: trainer_config_text(job)},
        }
    )
