"""``python -m grpo_trainer``: read $GRPO_CONFIG, pick the loop for the rollout source, and turn what
ended it into an exit code (errors.py, docs/trainer.md "Exit codes").

The steps every loop shares are in steps.py; the loops in metric_loop.py (the job's metric service scores
the trainer's answers) and client_loop.py (a client sends scored groups through the rollout gateway).
They are imported when chosen: this module must import without torch, so that a configuration error is
reported even where the training libraries are missing.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import traceback
from pathlib import Path

from grpo_operator.api.trainer_config import TrainerConfig, trainer_log_path

from grpo_trainer.errors import (
    CheckpointMismatch,
    ConfigError,
    ExitCode,
    MemoryPlanExceeded,
    NonFiniteTraining,
    NotLearning,
    fail,
    is_cuda_out_of_memory,
    out_of_memory_reason,
)
from grpo_trainer.gateway_client import GatewayProtocolError, GatewayUnavailable
from grpo_trainer.grpo_config import RuntimeEnv, load_config
from grpo_trainer.log_capture import capture_output
from grpo_trainer.metric_client import MetricServiceUnavailable
from grpo_trainer.signals import StopFlag
from grpo_trainer.steps import check_memory, claim_workspace, plan_steps
from grpo_trainer.vllm_wait import GenerationUnavailable
from grpo_trainer.weight_sync import stop_retrying_when


def run(config: TrainerConfig, env: RuntimeEnv) -> int:
    """Train to the end (or to SIGTERM); return the exit code. Raises ConfigError,
    MetricServiceUnavailable, CheckpointMismatch and NonFiniteTraining for the caller to classify."""
    stop = StopFlag()
    signal.signal(signal.SIGTERM, stop.set)
    stop_retrying_when(stop.is_set)
    plan = plan_steps(config, env)
    check_memory(config, env)
    workspace = claim_workspace(config, env)
    if config.rollouts is not None:
        from grpo_trainer.client_loop import run_client_loop

        return run_client_loop(config, env, plan, workspace, stop)
    if config.environment is not None:
        from grpo_trainer.environment_loop import run_environment_loop

        return run_environment_loop(config, env, plan, workspace, stop)
    from grpo_trainer.metric_loop import run_metric_loop

    return run_metric_loop(config, env, plan, workspace, stop)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=os.environ.get("GRPO_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    config: TrainerConfig | None = None
    try:
        env = RuntimeEnv.from_environ()
        config = load_config(argv[0] if argv else None)
        capture_output(Path(trainer_log_path(config.output_dir, env.attempt, env.rank)))
        return run(config, env)
    except ConfigError as exc:
        return fail(ExitCode.CONFIG_INVALID, str(exc))
    except MetricServiceUnavailable as exc:
        return fail(ExitCode.METRIC_UNAVAILABLE, str(exc))
    except CheckpointMismatch as exc:
        return fail(ExitCode.CHECKPOINT_MISMATCH, str(exc))
    except NonFiniteTraining as exc:
        return fail(ExitCode.NON_FINITE, str(exc))
    except MemoryPlanExceeded as exc:
        return fail(ExitCode.MEMORY_PLAN_EXCEEDED, str(exc))
    except NotLearning as exc:
        return fail(ExitCode.NOT_LEARNING, str(exc))
    except GenerationUnavailable as exc:
        return fail(ExitCode.TRANSIENT, str(exc))
    except (GatewayProtocolError, GatewayUnavailable) as exc:
        return fail(ExitCode.TRANSIENT, str(exc))
    except KeyboardInterrupt:
        return fail(ExitCode.TRANSIENT, "interrupted")
    except Exception as exc:
        traceback.print_exc()
        if is_cuda_out_of_memory(exc):
            return fail(ExitCode.OUT_OF_MEMORY, _out_of_memory_reason(exc, config))
        return fail(ExitCode.TRANSIENT, f"{type(exc).__name__}: {exc}")


def _out_of_memory_reason(exc: BaseException, config: TrainerConfig | None) -> str:
    if config is None:
        return out_of_memory_reason(exc, per_device_batch_size=1, lora=False, gpus=1)
    return out_of_memory_reason(
        exc,
        per_device_batch_size=config.trainer.per_device_batch_size,
        lora=config.grpo.lora.enabled,
        gpus=config.trainer.nodes * config.trainer.gpus_per_node,
    )
