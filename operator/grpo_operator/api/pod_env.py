"""Names of the environment variables the operator itself puts on trainer and vLLM containers.

Two kinds: those the operator fixes (a job's own entry of the same name is ignored, because the operator must
control rank, topology, resume point and vLLM's development routes) and its overridable defaults. The
platform's network variables (settings.network_env) may use neither: a platform value there would silently
replace what the trainer contract needs, or a default a job is meant to be able to change.
tests/unit/test_fast_network.py checks that every variable on a rendered pod is named here.
"""

from __future__ import annotations

from grpo_operator.api.gateway_config import GATEWAY_INTERNAL_TOKEN_ENV
from grpo_operator.api.tracking import MLFLOW_CREDENTIAL_KEYS, WANDB_API_KEY_ENV
from grpo_operator.api.trainer_config import CONFIG_ENV

# Environment the trainer contract fixes (docs/operations.md); a spec.trainer.env entry with one of
# these names is ignored, because the operator must control rank, topology and resume point.
RESERVED_TRAINER_ENV = frozenset(
    {
        CONFIG_ENV,
        "RESUME_FROM",
        "RANK",
        "WORLD_SIZE",
        "NODE_RANK",
        "NNODES",
        "NPROC_PER_NODE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "GRPO_JOB_NAMESPACE",
        "GRPO_JOB_NAME",
        "GRPO_TRAINER_ATTEMPT",
        "GRPO_VLLM_URL",
        "GRPO_METRIC_URL",
        "VLLM_HOST_IP",
        "POD_NAME",
        # The rollout gateway's internal token: rank 0's from the job's Secret, no one else's.
        GATEWAY_INTERNAL_TOKEN_ENV,
    }
)
# Variables of the vLLM container the operator fixes: TRL's weight-update routes exist only in dev mode.
RESERVED_GENERATION_ENV = frozenset({"VLLM_SERVER_DEV_MODE"})
# The Hugging Face access token variable both vLLM and the trainer (huggingface_hub) read.
HF_TOKEN_ENV = "HF_TOKEN"

# Every other variable the operator may set on those containers: its defaults a job may override
# (builders/gang.py), the writable home and user name (builders/security.py), the Hugging Face token and the
# trackers' credentials (rank 0).
OPERATOR_DEFAULT_ENV = frozenset(
    {
        "HF_HOME",
        "HF_HUB_DISABLE_TELEMETRY",
        "PYTORCH_CUDA_ALLOC_CONF",
        "NCCL_DEBUG",
        "VLLM_NO_USAGE_STATS",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
        "HOME",
        "USER",
        HF_TOKEN_ENV,
        WANDB_API_KEY_ENV,
        *MLFLOW_CREDENTIAL_KEYS,
    }
)
OPERATOR_POD_ENV = RESERVED_TRAINER_ENV | RESERVED_GENERATION_ENV | OPERATOR_DEFAULT_ENV
