"""ConfigMap `<job>-config`: the trainer config (trainer.json) rendered from the spec."""

from __future__ import annotations

from grpo_operator.api.gateway_config import GATEWAY_CONFIG_KEY, GATEWAY_INTERNAL_TOKEN_ENV, GatewayConfig
from grpo_operator.api.learning_health import LearningHealthSpec
from grpo_operator.api.tracking import resolved_tracking
from grpo_operator.api.trainer_config import ROLLOUTS_TOKEN_ENV, JobRef, TrainerConfig
from grpo_operator.builders.common import (
    CONFIG_KEY,
    Job,
    Manifest,
    client_rollouts,
    config_map_name,
    content_hash,
    environment_url,
    gateway_url,
    generation_host,
    generation_replicas,
    metadata,
    metric_url,
    policy_url,
    with_hash,
)
from grpo_operator.settings import OperatorSettings


def trainer_config(job: Job, settings: OperatorSettings) -> TrainerConfig:
    """The config the trainer reads; the vLLM server is the job's `<job>-gen` Service (and with several
    replicas, every replica's Service, in serverUrls), the environment server `<job>-env`. Every port comes
    from ``settings``, the same values the pods and Services are built with."""
    config = TrainerConfig.from_spec(
        job.namespace,
        job.name,
        job.uid,
        job.spec,
        metric_url=metric_url(job),
        environment_url=environment_url(job),
        gateway_url=gateway_url(job) if client_rollouts(job) else None,
        generation_host=generation_host(job),
        generation_replica_hosts=[generation_host(job, r) for r in generation_replicas(job)],
        backend="vllm-server",
        vllm_port=settings.vllm_port,
        weight_sync_port=settings.weight_sync_port,
        metrics_port=settings.trainer_metrics_port,
    )
    if settings.learning_health_defaults:
        # The platform's thresholds under the job's own: trainer.json carries what the trainer judges by.
        own = config.grpo.learning_health or LearningHealthSpec()
        merged = own.merged_over(settings.learning_health_defaults)
        config.grpo = config.grpo.model_copy(update={"learning_health": merged})
    config.tracking = resolved_tracking(config.tracking, settings.tracking_defaults)
    return config


def trainer_config_text(job: Job, settings: OperatorSettings) -> str:
    return trainer_config(job, settings).dump_json() + "\n"


def config_hash(job: Job, settings: OperatorSettings) -> str:
    """Hash of trainer.json; pods carry it so a config change is a pod change (gang restart)."""
    return content_hash(trainer_config_text(job, settings))


# JSON bytes per token of a transcript: a token is about 4 characters, 6 bytes each when JSON escapes them,
# and twice over because the trainer truncates prompts (maxPromptLength) that the client may send longer.
_TRANSCRIPT_BYTES_PER_TOKEN = 64
_TRANSCRIPT_OVERHEAD_BYTES = 64 * 1024


def max_transcript_bytes(job: Job) -> int:
    """Body limit of one chat transcript at the gateway, from the lengths the spec trains on."""
    grpo = job.spec.grpo
    tokens = grpo.max_prompt_length + grpo.max_completion_length
    return _TRANSCRIPT_OVERHEAD_BYTES + _TRANSCRIPT_BYTES_PER_TOKEN * tokens


def gateway_config(job: Job) -> GatewayConfig:
    """The rollout gateway's config (client-rollout jobs)."""
    spec = job.spec
    client = spec.rollouts.client if spec.rollouts is not None else None
    return GatewayConfig(
        job=JobRef(namespace=job.namespace, name=job.name, uid=job.uid or None),
        served_model=spec.model.name,
        group_size=spec.grpo.group_size,
        prompts_per_step=spec.grpo.prompts_per_step,
        steps=spec.grpo.steps,
        trainer_url=policy_url(job),
        token_env=ROLLOUTS_TOKEN_ENV if client is not None and client.token_secret_ref is not None else None,
        # A completion waits for the trainer as long as the trainers wait for vLLM: through a gang restart.
        completion_wait_seconds=float(spec.generation.startup_timeout_seconds),
        max_transcript_bytes=max_transcript_bytes(job),
        # The gateway answers the internal port only to the holder of the job's gateway-token Secret.
        internal_token_env=GATEWAY_INTERNAL_TOKEN_ENV,
    )


def gateway_config_text(job: Job) -> str:
    return gateway_config(job).dump_json() + "\n"


def trainer_config_map(job: Job, settings: OperatorSettings) -> Manifest:
    data = {CONFIG_KEY: trainer_config_text(job, settings)}
    if client_rollouts(job):
        data[GATEWAY_CONFIG_KEY] = gateway_config_text(job)
    return with_hash(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata(job, config_map_name(job), "trainer"),
            "data": data,
        }
    )
