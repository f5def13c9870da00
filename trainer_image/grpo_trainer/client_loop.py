"""The client-driven loop (trainer.json ``rollouts`` set; no metric service, no dataset): the shared steps
of steps.py with the client's groups as the rollout source.

Per optimizer step k: rank 0 asks the rollout gateway for step k's B groups (waiting, with
``status.progress.waitingForClientSince`` set, until the client has sent them), every rank trains on its slice
through TRL's rollout_func (client_rollouts.py), rank 0 reports the step and each published checkpoint
back to the gateway. Rank 0 also runs the policy server the gateway forwards completion requests to.

Endings: all S steps -> final model, exit 0; the client's terminate -> a checkpoint of the last step
trained, the final model, exit 0; cancel -> exit 7 (CANCELLED), nothing more written; SIGTERM (also
while waiting for the client) -> checkpoint, exit 0, resumed later. A restarted trainer resumes from
the checkpoint at step c and asks the gateway for step c+1 again: the gateway keeps the groups of steps
after its newest checkpoint, so they are trained on again (replay) and the client's work is not lost.

A group the trainer cannot train on because of its data (a reward beyond the reward bound, which the
gateway should already have refused) does not fail the step: it is skipped with advantage 0, logged by its
batch_id and counted (grpo_groups_skipped_total, metrics.jsonl ``skipped_groups``), and the step goes on and
is reported to the gateway like any other, so the group is consumed with it. A replay of that step after a
restart skips it again; no restart is spent on it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grpo_operator.api.learning_health import Thresholds
from grpo_operator.api.trainer_config import TrainerConfig

from grpo_trainer.client_rollouts import (
    ClientReward,
    ClientStop,
    GroupFeed,
    PolicyLock,
    SampleMatcher,
    make_rollout_func,
)
from grpo_trainer.cost import attempt_ledger
from grpo_trainer.errors import ExitCode, NotLearning, fail
from grpo_trainer.gateway_client import GatewayClient
from grpo_trainer.grpo_config import BatchPlan, RuntimeEnv
from grpo_trainer.learning_health import LearningMonitor
from grpo_trainer.progress import ProgressCallback, iso_now
from grpo_trainer.sample_book import SampleBook
from grpo_trainer.signals import StopFlag
from grpo_trainer.steps import (
    Workspace,
    build_trainer,
    close_status,
    finish,
    grpo_args,
    load_tokenizer,
    restore,
    start_reporting,
    tracking_options,
    train,
)
from grpo_trainer.trl_adapter import load_checkpoint_weights, save_checkpoint_now

if TYPE_CHECKING:
    from grpo_trainer.trainer import ProjectGRPOTrainer

log = logging.getLogger("grpo_trainer.client_loop")

# How long one groups request long-polls on the gateway (also how soon SIGTERM is noticed while waiting).
GATEWAY_WAIT_ENV = "GRPO_GATEWAY_WAIT_SECONDS"
# How long the trainer keeps retrying a gateway that does not answer before it exits 1 (restart).
GATEWAY_UNREACHABLE_ENV = "GRPO_GATEWAY_UNREACHABLE_TIMEOUT_SECONDS"


def placeholder_rows(steps: int, prompts_per_step: int) -> Any:
    """S*B rows for TRL's sampler; their content is never used (rollout_func brings the client's prompts)."""
    from datasets import Dataset

    count = steps * prompts_per_step
    return Dataset.from_dict({"prompt": [""] * count, "slot": list(range(count))})


def checkpoint_report(manifest: Any) -> dict[str, Any] | None:
    """A published checkpoint as the gateway's progress route takes it."""
    if manifest is None:
        return None
    return {
        "name": f"step-{manifest.step}",
        "dir": manifest.path,
        "step": manifest.step,
        "time": manifest.time,
    }


@dataclass
class ClientProgressCallback(ProgressCallback):
    """ProgressCallback plus the client loop's duties: the policy lock around each step, checkpoints the
    client requested, progress reports to the gateway, waiting-for status."""

    feed: GroupFeed | None = None
    gateway: GatewayClient | None = None
    lock: PolicyLock | None = None
    newest_checkpoint: dict[str, Any] | None = None
    # The step of the newest checkpoint, on every rank (the terminate path decides collectively whether
    # the last step still needs one).
    saved_step: int = 0
    _waiting: str | None = field(default=None, repr=False)

    def reward_seconds(self) -> float:
        """For client jobs: cumulative time rank 0 waited for the client's groups."""
        return self.feed.waited_seconds if self.feed is not None else 0.0

    def rollout_fields(self) -> dict[str, Any]:
        # Completions trained on the tokens the policy server sampled, and those tokenised from the client's
        # text because the policy server never sampled it (client_rollouts.py).
        if self.feed is None:
            return {}
        return {
            "client_completions_matched": self.feed.matched,
            "client_completions_unmatched": self.feed.unmatched,
        }

    def set_waiting(self, kind: str | None) -> None:
        """status.progress.waitingForClientSince: when rank 0 began waiting for the client's groups, so the
        operator's stall detector tells waiting for the client (normal) from hanging; removed when the
        step starts. Waiting for an unreachable gateway is not waiting for the client: it is cleared too."""
        if kind == self._waiting:
            return
        was_client, self._waiting = self._waiting == "client", kind
        if self.status is None:
            return
        if kind == "client":
            self.status.update({"progress": {"waitingForClientSince": iso_now()}}, force=True)
        elif was_client:
            self.status.update({"progress": {"waitingForClientSince": None}}, force=True)

    def describe_group(self, index: int) -> str:
        # The gateway's batch_id is what the client's own logs and the gateway's know the group by.
        last = self.feed.last if self.feed is not None else None
        if last is None or index >= len(last.groups):
            return super().describe_group(index)
        return f"the client's group {index} of the step (batch_id {last.groups[index].batch_id})"

    def report(self, step: int, state: str) -> None:
        if self.gateway is not None:
            self.gateway.progress(step, self.newest_checkpoint, state)  # type: ignore[arg-type]

    def finished(self, step: int) -> None:
        """The final model is saved: the gateway tells the client the run is over."""
        self.report(step, "finished")

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        super().on_step_begin(args, state, control, **kwargs)
        if self.lock is not None:
            self.lock.take()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        super().on_step_end(args, state, control, **kwargs)
        if self.feed is not None and self.feed.checkpoint_requested is not None:
            log.info(
                "the client asked for checkpoint %r: saving step %d",
                self.feed.checkpoint_requested,
                state.global_step,
            )
            self.feed.checkpoint_requested = None
            control.should_save = True
        if self.lock is not None:
            self.lock.give()

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        super().on_log(args, state, control, logs=logs, **kwargs)
        if self.is_main and logs and "train_runtime" not in logs:
            self.report(state.global_step, "training")

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.saved_step = int(state.global_step)
        super().on_save(args, state, control, **kwargs)
        if self.is_main and self.trainer is not None and self.trainer.grpo_last_manifest is not None:
            self.newest_checkpoint = checkpoint_report(self.trainer.grpo_last_manifest)
            self.report(state.global_step, "training")


def run_client_loop(
    config: TrainerConfig, env: RuntimeEnv, plan: BatchPlan, workspace: Workspace, stop: StopFlag
) -> int:
    rollouts = config.rollouts
    assert rollouts is not None
    if config.grpo.dynamic_sampling:
        log.warning("grpo.dynamicSampling is ignored for client rollouts: the client decides what is sampled")
        config = config.model_copy(
            update={"grpo": config.grpo.model_copy(update={"dynamic_sampling": False})}
        )
    # TRL warns that rollout_func is experimental; trl_adapter.py records what this loop relies on in it and
    # tests/trainer/test_trl_adapter.py checks it against the installed TRL.
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = load_tokenizer(config)
    # Rollouts are trained on the tokens the policy server sampled, with their log-probabilities, so TRL's
    # vLLM importance-sampling correction applies as in metric jobs (client_rollouts.py), at TRL's defaults.
    # Except for vespo, which weighs whole sequences itself and which TRL refuses beside the default
    # sequence-level correction (metric jobs must choose a token mode; a client job cannot set it).
    overrides = {"vllm_importance_sampling_correction": False} if config.grpo.loss_type == "vespo" else {}
    args = grpo_args(config, plan, env, **overrides)
    reporting = start_reporting(config, env, workspace)
    lock = PolicyLock() if env.is_main else None
    callback = ClientProgressCallback(
        reward=ClientReward(config.grpo.format_failure_score),
        total_steps=config.grpo.steps,
        output_dir=workspace.output_dir,
        stop=stop,
        budget=None,
        is_main=env.is_main,
        metrics=reporting.metrics,
        status=reporting.status,
        lock=lock,
        cost=attempt_ledger(config, env.world_size, 0, reporting.status),
        learning=LearningMonitor(Thresholds.of(config.grpo.learning_health)),
        **tracking_options(config, workspace),
    )
    gateway = None
    if env.is_main:
        gateway = GatewayClient(
            url=rollouts.gateway_url,
            attempt=env.attempt,
            group_size=config.grpo.group_size,
            prompts_per_step=config.grpo.prompts_per_step,
            wait_seconds=float(os.environ.get(GATEWAY_WAIT_ENV, "10")),
            unreachable_timeout_seconds=float(os.environ.get(GATEWAY_UNREACHABLE_ENV, "600")),
            on_wait=callback.set_waiting,
        )
    book = SampleBook() if env.is_main else None
    feed = GroupFeed(
        client=gateway,
        world_size=env.world_size,
        should_stop=stop.is_set,
        match=SampleMatcher(book, tokenizer, config.grpo.chat_template_arguments())
        if book is not None
        else None,
    )
    callback.feed, callback.gateway = feed, gateway
    trainer = build_trainer(
        config,
        workspace,
        args,
        tokenizer,
        placeholder_rows(config.grpo.steps, config.grpo.prompts_per_step),
        callback.reward,
        callback,
        reporting,
        rollout_func=make_rollout_func(
            feed,
            tokenizer,
            config.grpo.max_completion_length,
            lock,
            config.grpo.chat_template_arguments(),
        ),
    )
    resumed_step = restore(trainer, config, env, workspace, reporting)
    callback.saved_step = resumed_step
    server = None
    try:
        if env.is_main:
            if workspace.resume:
                # Before the policy server answers: the client must sample from the resumed policy, and
                # trainer.train loads the checkpoint only when it starts.
                load_checkpoint_weights(trainer, workspace.resume)
                callback.newest_checkpoint = resumed_checkpoint(workspace, resumed_step)
            server = start_policy_server(config, trainer, tokenizer, lock, book)
            callback.report(resumed_step, "training")
        try:
            train(trainer, config, workspace, resumed_step)
        except ClientStop as ended:
            return stopped(trainer, callback, env, workspace, ended)
        if callback.not_learning is not None:
            raise NotLearning(
                f"stopped as grpo.learningHealth.stopWhenUnhealthy asks: {callback.not_learning}"
            )
        return finish(
            trainer,
            env,
            workspace,
            stopped_by_signal=callback.stopped_by_signal,
            on_finished=callback.finished,
        )
    finally:
        if lock is not None:
            lock.give()
        if server is not None:
            server.close()
        callback.set_waiting(None)
        close_status(reporting)


def resumed_checkpoint(workspace: Workspace, step: int) -> dict[str, Any] | None:
    from grpo_trainer.checkpoints import read_manifest

    manifest = read_manifest(workspace.checkpoint_dir)
    if manifest is None or manifest.step != step:
        return None
    return checkpoint_report(manifest)


def start_policy_server(
    config: TrainerConfig,
    trainer: ProjectGRPOTrainer,
    tokenizer: Any,
    lock: PolicyLock | None,
    book: SampleBook | None,
) -> Any:
    from grpo_trainer.policy_server import PolicyServer, transformers_sampler, vllm_sampler

    rollouts = config.rollouts
    assert rollouts is not None and lock is not None
    if config.generation.backend == "vllm-server":
        sampler = vllm_sampler(trainer, tokenizer)
    else:
        sampler = transformers_sampler(trainer, tokenizer)
    return PolicyServer(
        rollouts.policy_port,
        rollouts.served_model,
        tokenizer,
        sampler,
        max_completion_length=config.grpo.max_completion_length,
        temperature=config.grpo.temperature,
        top_p=config.grpo.top_p,
        lock=lock,
        chat_template_kwargs=config.grpo.chat_template_arguments(),
        book=book,
    ).start()


def stopped(
    trainer: ProjectGRPOTrainer,
    callback: ClientProgressCallback,
    env: RuntimeEnv,
    workspace: Workspace,
    ended: ClientStop,
) -> int:
    """The run ended between two steps (every rank raised the same ClientStop)."""
    step = int(trainer.state.global_step)
    if ended.kind == "cancel":
        callback.report(step, "cancelled")
        return fail(
            ExitCode.CANCELLED,
            f"the client cancelled the run after step {step}; nothing more is trained or saved",
        )
    if step > 0 and callback.saved_step != step:
        save_checkpoint_now(trainer)
        callback.on_save(trainer.args, trainer.state, trainer.control)
    if ended.kind != "signal":
        log.info("the client terminated the run after step %d", step)
    return finish(
        trainer,
        env,
        workspace,
        stopped_by_signal=ended.kind == "signal",
        waiting=" while waiting for the client,",
        on_finished=callback.finished,
    )
