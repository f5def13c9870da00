"""Environment jobs (spec.environment) against a real vLLM server (PyPI's CPU build) and real OpenEnv
servers, at the numerics a GRPOJob gets by default (bf16 compute over fp32 masters, lr 1e-6): episodes of
several turns are trained on exactly the tokens vLLM sampled, an environment's failures are left unscored,
and a job killed mid-episode replays its step. The vLLM server is the session's served_tiny
(tests/trainer/conftest.py)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from grpo_metric import MetricServer

from tests.harness import openenv_env, vllm_server
from tests.harness.ports import free_port
from tests.trainer.toy import read_jsonl, start_trainer
from tests.trainer.vllm_runs import (
    calculator_config,
    check_async_rows,
    environment_config,
    serve_calculator,
    train_logging_every_episode,
)
from tests.trainer.weights import changed_overall, load_weights

pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.vllm]

# Steps of the OpenEnv-template run. Three steps whose groups all tied failed one run in some fifteen CI
# runs, which puts a step with nothing to learn from at about 0.4 (0.4^3 = 0.064); six all tied then come
# about once in 250 runs.
STEPS = 6


def test_three_turn_episodes_against_openenvs_template_train_exactly_the_sampled_tokens(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer, served_tiny: vllm_server.VLLMProcess
) -> None:
    # An environment no one here wrote: `openenv init`'s template (it echoes each message back, rewards its
    # length, never ends an episode and serves one session at a time), served unchanged.
    env = openenv_env.serve(openenv_env.generated_env(tmp_path), free_port(), tmp_path / "env.log")
    try:
        config = environment_config(
            tmp_path, tiny_model, toy_metric, served_tiny, env.url, steps=STEPS,
            maxTurns=3, maxTurnTokens=6, maxObservationTokens=12, observationField="echoed_message", concurrency=1,
        )  # fmt: skip
        train_logging_every_episode(config, tmp_path)
    finally:
        env.stop()

    rows = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["episodes"] for r in rows] == [4] * STEPS, rows
    assert all(r["environment_errors"] == 0 and r["environment_steps"] > 0 for r in rows), rows
    # At bf16 the loss's log-probabilities of the sampled tokens are vLLM's, up to rounding: the importance
    # ratio of every trained token stays within 5 % of 1 (a transcript re-tokenised differently than it was
    # sampled gives ratios of e^2 and beyond).
    for row in rows:
        assert 0.95 < row["importance_sampling_ratio_min"] <= row["importance_sampling_ratio_max"] < 1.05, row
    episodes = read_jsonl(tmp_path / "out" / "episodes.jsonl")
    assert len(episodes) == 4 * STEPS, episodes
    multi_turn = 0
    for episode in episodes:
        turns = episode["turns"]
        sampled = [t for turn in turns for t in turn["ids"]]
        glue = [t for turn in turns for t in turn["observationIds"]]
        trained, mask = episode["trainedIds"], episode["trainedMask"]
        # The loss sees the model's tokens exactly as vLLM sampled them, and nothing else: every token under
        # the mask is a sampled one, in order, and every environment token is outside it.
        assert [t for t, m in zip(trained, mask, strict=True) if m] == sampled, episode
        assert [t for t, m in zip(trained, mask, strict=True) if not m] == glue, episode
        assert trained == [t for turn in turns for t in turn["ids"] + turn["observationIds"]], episode
        for turn in turns:
            assert turn["ids"] and len(turn["logprobs"]) == len(turn["ids"]), turn
            assert all(lp is not None and lp <= 0 for lp in turn["logprobs"]), turn
            if turn["observation"] is not None:
                # What came back is the template's echo of the model's own turn.
                assert turn["observation"].startswith(turn["text"][:8]), turn
        # The template never ends an episode: each runs to maxTurns (or the token budget) and is truncated,
        # rewarded with its last step's reward, 0.1 per character echoed.
        assert episode["outcome"] == "truncated", episode
        assert episode["reward"] == pytest.approx(turns[-1]["reward"]), episode
        multi_turn += len(turns) == 3
    assert multi_turn >= 4, [len(e["turns"]) for e in episodes]

    # And at lr 1e-6 the fp32 masters move in the first step that has an advantage to learn from. A step
    # whose two groups both tied (each pair of episodes echoed as many characters, a common outcome with
    # 6-token turns) has none and must leave the weights as they were (STEPS says how often all do). The
    # embedding is left out: only the rows of tokens in a group with an advantage get a gradient, a minority
    # of this tiny vocabulary's rows.
    learning = [r["step"] for r in rows if r["tied_groups"] < r["groups"]]
    assert learning, f"every group of every step tied, nothing to learn from: {rows}"
    embed = "model.embed_tokens.weight"
    checkpoints = [tiny_model] + [tmp_path / "ckpt" / f"step-{s}" for s in range(1, learning[0] + 1)]
    weights = [load_weights(c) for c in checkpoints]
    body = [k for k in weights[0] if k != embed]
    for step in range(1, learning[0] + 1):
        moved = changed_overall({k: weights[step - 1][k] for k in body}, {k: weights[step][k] for k in body})
        if step < learning[0]:
            assert moved == 0, f"{moved:.2%} of the weights moved in step {step}, whose groups all tied"
        else:
            assert moved >= 0.99, f"only {moved:.2%} of the weights moved in step {step} at lr 1e-6"


def test_an_environment_that_errs_hangs_or_rewards_nan_fails_its_episodes_unscored_then_the_job(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer, served_tiny: vllm_server.VLLMProcess
) -> None:
    # Each step's 4 episodes: one fair, the others meet an exception, a 30 s hang and a NaN reward.
    env = openenv_env.serve(
        Path(__file__).parent / "environments", free_port(), tmp_path / "env.log", app="hostile_env:app"
    )
    try:
        config = environment_config(
            tmp_path, tiny_model, toy_metric, served_tiny, env.url, steps=3,
            maxTurns=3, maxTurnTokens=4, observationField="text", concurrency=4, timeoutSeconds=3,
        )  # fmt: skip
        process = start_trainer(config, tmp_path / "trainer.log", GRPO_EPISODES_LOGGED_PER_STEP="100")
        code = process.wait(timeout=900)
    finally:
        env.stop()
    log = (tmp_path / "trainer.log").read_text()
    rows = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    episodes = read_jsonl(tmp_path / "out" / "episodes.jsonl")
    fair = [e for e in episodes if e["outcome"] == "done"]
    failed = [e for e in episodes if e["outcome"] == "environment_error"]
    # Step 1 trains on the fair episodes alone: the failed ones are unscored (reward none, never 0), so the
    # step's mean is the fair episodes' 1.0, and each failure names what the environment did.
    assert len(rows) == 1 and rows[0]["episodes"] == 4 and rows[0]["environment_errors"] == 3, rows
    # They are the environment's failures, not the metric's: no MetricErrors diagnosis, alert or budget.
    assert rows[0]["metric_error_ratio"] == 0, rows
    assert len(fair) == 1 and len(failed) == 3, episodes
    assert rows[0]["reward_mean"] == pytest.approx(1.0), rows[0]
    assert fair and all(e["reward"] == 1.0 for e in fair), fair
    assert failed and all(e["reward"] is None for e in failed), failed
    reasons = " | ".join(e["reason"] for e in failed)
    assert "reported an error" in reasons and "did not answer a step within 3s" in reasons, reasons
    # OpenEnv's JSON turns the NaN reward into null: a finished episode without a reward.
    assert "ended the episode without a reward" in reasons, reasons
    # Then errorBudget (5 % of a 20-step window) runs out: the job stops with the environment named, exit 3.
    assert code == 3, log[-3000:]
    assert "spec.environment.errorBudget" in log, log[-3000:]


def test_an_environment_job_killed_mid_episode_replays_the_step_and_trains_every_episode_once(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer, served_tiny: vllm_server.VLLMProcess
) -> None:
    """SIGKILL while a step's episodes talk to the calculator: nothing of that step was trained, so the
    resumed trainer replays it from the checkpoint on the same prompts, and every step's episodes are
    trained (and logged) once."""
    env = serve_calculator(tmp_path)
    steps = 5
    try:
        config = calculator_config(tmp_path, tiny_model, toy_metric, served_tiny, env.url, steps)
        data = json.loads(config.read_text())
        data["checkpoints"]["everySteps"] = 2
        config.write_text(json.dumps(data))
        process = start_trainer(config, tmp_path / "killed.log")
        deadline = time.monotonic() + 600
        while len(read_jsonl(tmp_path / "out" / "metrics.jsonl")) < 3 and process.poll() is None:
            assert time.monotonic() < deadline, "step 3 never came"
            time.sleep(0.02)
        # Step 4's episodes start as soon as step 3 is logged.
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
        before = read_jsonl(tmp_path / "out" / "episodes.jsonl")
        checkpoint = json.loads((tmp_path / "ckpt" / "latest.json").read_text())["step"]
        assert checkpoint == 2 and {e["step"] for e in before} == {1, 2, 3}, (checkpoint, before)

        resumed = start_trainer(config, tmp_path / "resumed.log")
        assert resumed.wait(timeout=600) == 0, (tmp_path / "resumed.log").read_text()[-4000:]
    finally:
        env.stop()
    rows = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, steps + 1)), rows
    episodes = read_jsonl(tmp_path / "out" / "episodes.jsonl")
    assert sorted(e["step"] for e in episodes) == [s for s in range(1, steps + 1) for _ in range(4)], episodes

    def prompts(records: list[dict[str, Any]], step: int) -> list[str]:
        return sorted(e["prompt"] for e in records if e["step"] == step)

    # The replayed step 3 reset its episodes with the prompts the killed attempt had for it.
    assert prompts(episodes, 3) == prompts(before, 3)


def test_a_metric_beside_the_environment_scores_each_episodes_final_answer(
    tmp_path: Path, tiny_model: Path, served_tiny: vllm_server.VLLMProcess
) -> None:
    """spec.environment and spec.metric together: the environment (OpenEnv's template, rewarding each echo
    by its length) runs the episode, the job's metric service scores the model's last turn against the
    dataset row, and each trained reward is the two added, with the environment's part named."""
    seen: list[str] = []

    def final_answer_length(example: dict[str, Any], completion: str) -> dict[str, float]:
        assert example["answer"] and "prompt" in example, example
        seen.append(completion)
        return {"answer_length": len(completion) / 100}

    env = openenv_env.serve(openenv_env.generated_env(tmp_path), free_port(), tmp_path / "env.log")
    try:
        with MetricServer(final_answer_length) as metric:
            config = environment_config(
                tmp_path, tiny_model, metric, served_tiny, env.url, steps=2,
                with_metric=True, maxTurns=2, maxTurnTokens=6, observationField="echoed_message", concurrency=1,
            )  # fmt: skip
            train_logging_every_episode(config, tmp_path)
    finally:
        env.stop()

    episodes = read_jsonl(tmp_path / "out" / "episodes.jsonl")
    samples = [s for s in read_jsonl(tmp_path / "out" / "samples.jsonl") if s["split"] == "train"]
    assert len(episodes) == len(samples) == 8, (episodes, samples)
    # The metric saw each episode's final model turn, nothing of the environment's.
    assert sorted(seen) == sorted(e["turns"][-1]["text"] for e in episodes), seen
    for episode, sample in zip(episodes, samples, strict=True):
        parts = sample["components"]
        assert parts["environment"] == pytest.approx(episode["environmentReward"]), (episode, sample)
        assert episode["reward"] == pytest.approx(sample["reward"]), (episode, sample)
        assert parts["answer_length"] == pytest.approx(len(episode["turns"][-1]["text"]) / 100), parts
        assert sample["reward"] == pytest.approx(parts["environment"] + parts["answer_length"]), sample
    rows = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert all(r["environment_errors"] == 0 and r["metric_error_ratio"] == 0 for r in rows), rows
    assert all(set(r["reward_components"]) == {"environment", "answer_length"} for r in rows), rows


def test_asynchronous_episodes_run_a_step_ahead_stamped_with_their_weights_and_are_validated(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer, served_tiny: vllm_server.VLLMProcess
) -> None:
    """spec.grpo.maxStaleness 1 on an environment job: the next step's episodes run against the calculator
    while this one trains; each episode carries the policy version vLLM sampled all its turns with, within
    the bound, and is still trained on exactly its sampled tokens. Validation runs its own episodes every
    second step on that step's weights."""
    env = serve_calculator(tmp_path)
    steps = 4
    try:
        config = calculator_config(
            tmp_path, tiny_model, toy_metric, served_tiny, env.url, steps,
            maxStaleness=1, validation={"everySteps": 2, "maxPrompts": 4},
        )  # fmt: skip
        train_logging_every_episode(config, tmp_path)
    finally:
        env.stop()
    rows = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, steps + 1)), rows
    check_async_rows(rows, eta=1)
    # Later steps' episodes ran while the step before trained: a version behind.
    assert any(r["staleness"] == 1 for r in rows[1:]), rows
    version = {r["step"]: r["policy_version"] for r in rows}
    episodes = read_jsonl(tmp_path / "out" / "episodes.jsonl")
    assert len(episodes) == 4 * steps, episodes
    for episode in episodes:
        assert episode["policyVersion"] == version[episode["step"]], (
            episode["step"],
            episode["policyVersion"],
        )
        if episode["outcome"] == "environment_error":
            continue
        sampled = [t for turn in episode["turns"] for t in turn["ids"]]
        trained, mask = episode["trainedIds"], episode["trainedMask"]
        assert [t for t, m in zip(trained, mask, strict=True) if m] == sampled, episode
    assert "were dropped" not in (tmp_path / "trainer.log").read_text()

    # Validation every 2 steps: one episode per validation prompt on the step's weights, its mean reward in
    # that step's row, each episode in samples.jsonl.
    validation = [s for s in read_jsonl(tmp_path / "out" / "samples.jsonl") if s["split"] == "validation"]
    for row in rows:
        mine = [s for s in validation if s["step"] == row["step"]]
        if row["step"] % 2:
            assert not mine and "validation_mean" not in row, row
            continue
        assert len(mine) == 4 and all(s["outcome"] and s["completion"] for s in mine), mine
        scored = [s["reward"] for s in mine if s["reward"] is not None]
        assert row["validation_mean"] == pytest.approx(sum(scored) / len(scored)), (row, mine)


def test_dynamic_sampling_replaces_tied_groups_of_episodes_and_trains_the_refills_token_for_token(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer, served_tiny: vllm_server.VLLMProcess
) -> None:
    """spec.grpo.dynamicSampling on an environment job: a group of episodes that all got the same reward is
    dropped and a new group runs on another prompt in its place. The environment ties three rows in four,
    so most steps refill; every trained episode, a refill's included, is trained on exactly the tokens vLLM
    sampled, and a replaced one is logged as not trained."""
    env = openenv_env.serve(
        Path(__file__).parent / "environments", free_port(), tmp_path / "env.log", app="tied_env:app"
    )
    steps = 3
    try:
        config = environment_config(
            tmp_path, tiny_model, toy_metric, served_tiny, env.url, steps=steps,
            maxTurns=2, maxTurnTokens=6, observationField="text", concurrency=4,
        )  # fmt: skip
        data = json.loads(config.read_text())
        data["grpo"]["dynamicSampling"] = True
        config.write_text(json.dumps(data))
        train_logging_every_episode(config, tmp_path)
    finally:
        env.stop()

    rows = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    episodes = read_jsonl(tmp_path / "out" / "episodes.jsonl")
    assert [r["step"] for r in rows] == list(range(1, steps + 1)), rows
    assert sum(r["refill_rounds"] for r in rows) > 0, rows
    for row in rows:
        mine = [e for e in episodes if e["step"] == row["step"]]
        # Every episode run is counted and logged: the step's 4 and 4 more for each refill round.
        assert row["episodes"] == len(mine) == 4 * (1 + row["refill_rounds"]), (row, mine)
        assert sorted({e["round"] for e in mine}) == list(range(1 + row["refill_rounds"])), mine
        # The step trains on 4 episodes, as many as without dynamic sampling.
        assert sum(e["trained"] for e in mine) == 4, mine
        for e in mine:
            assert e["reward"] == pytest.approx(e["environmentReward"]), e
            if not e["trained"]:
                # Only a tied group is replaced: the environment's tie is 0.5 for every episode.
                assert e["reward"] == 0.5 and "trainedIds" not in e, e
                continue
            sampled = [t for turn in e["turns"] for t in turn["ids"]]
            trained, mask = e["trainedIds"], e["trainedMask"]
            assert [t for t, m in zip(trained, mask, strict=True) if m] == sampled, e
    # A refill round's episode reached the loss in some step, and a tied one was left out.
    assert any(e["round"] > 0 and e["trained"] for e in episodes), episodes
    assert any(e["trained"] is False for e in episodes), episodes
