"""The trainer against a real vLLM server (PyPI's CPU build), started as the operator renders it: TRL's
client generates, and after every optimizer step the weights reach vLLM through the job's volume
(spec.generation.weightSync: Volume). Each test proves it with vLLM's own log-probabilities: after the run
the server serves exactly the weights of the last synced step (LoRA jobs: test_vllm_lora_sync.py), and a
model whose served output layer does not follow the sync (a tied embedding) is reported as drifted.

One server (tests/trainer/conftest.py's served_tiny) serves the untied tiny model to most tests, each run's
first sync replacing all its weights; the tied model needs a server of its own.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from grpo_metric import MetricServer

from tests.harness import vllm_server
from tests.helm.chart import CHART, metric_names
from tests.trainer.toy import (
    REPO,
    read_jsonl,
    start_trainer,
    torchrun_command,
    train_prompts,
    trainer_env,
)
from tests.trainer.vllm_runs import (
    PROBE_IDS,
    PRODUCTION_LR,
    SAME,
    check_async_rows,
    exported_samples,
    get_text,
    kill_replica_until_it_rejoins,
    mean_diff,
    run_trainer,
    sequence_logprobs,
    serve,
    served_logprobs,
    trained_logprobs,
    vllm_config,
)

pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.vllm]


def test_full_fine_tuning_serves_the_trained_weights_after_every_step(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer, served_tiny: vllm_server.VLLMProcess
) -> None:
    from transformers import AutoModelForCausalLM

    run_trainer(tmp_path, tiny_model, toy_metric, served_tiny)

    syncs = read_jsonl(tmp_path / "out" / "weight_syncs.jsonl")
    # One sync before each step's generation (steps 0, 1, 2), each checked by the trainer's own probe.
    assert [s["step"] for s in syncs] == [0, 1, 2], syncs
    assert all(s["transport"] == "volume" and s["in_sync"] for s in syncs), syncs
    assert all(s["logprob_diff"] < SAME for s in syncs), syncs
    # maxStaleness unset: the synchronous path, with no sampling thread and no staleness record.
    rows = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert len(rows) == 3 and not any("staleness" in r for r in rows), rows

    # Checked independently: vLLM now serves the weights of step 2 (synced before step 3's generation),
    # which differ from the base model's.
    served = served_logprobs(served_tiny, PROBE_IDS)
    step2 = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt" / "step-2")
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert mean_diff(served, trained_logprobs(step2, PROBE_IDS)) < SAME
    assert mean_diff(served, trained_logprobs(base, PROBE_IDS)) > 2 * SAME
    # Only the newest synced weights stay on the volume.
    assert [p.name for p in (tmp_path / "volume" / "weight-sync").iterdir()] == ["v000003"]
    log = (tmp_path / "trainer.log").read_text()
    assert "served model matches the trained one" in log


def test_default_dtype_at_a_production_learning_rate_trains_and_serves_bf16(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer, served_tiny: vllm_server.VLLMProcess
) -> None:
    """The numerics users get (model.dtype bfloat16, lr 1e-6, HF's default init) through real vLLM: the fp32
    master weights move, and what reaches the server is their bf16 rounding, half fp32's bytes."""
    import torch
    from safetensors.torch import load_file

    run_trainer(tmp_path, tiny_model, toy_metric, served_tiny, dtype="bfloat16", learningRate=1e-6)

    syncs = read_jsonl(tmp_path / "out" / "weight_syncs.jsonl")
    assert [s["step"] for s in syncs] == [0, 1, 2] and all(s["in_sync"] for s in syncs), syncs

    def weights(directory: Path) -> dict[str, torch.Tensor]:
        return {k: v for f in sorted(directory.glob("*.safetensors")) for k, v in load_file(str(f)).items()}

    base, step1, step2 = (
        weights(d) for d in (tiny_model, tmp_path / "ckpt" / "step-1", tmp_path / "ckpt" / "step-2")
    )
    # The embedding is judged apart: only the rows of tokens in a group with an advantage get a gradient,
    # and which tokens those are depends on what vLLM sampled (counting it in swung the overall figure
    # across 99 %). Every other weight gets a gradient every step.
    embed = "model.embed_tokens.weight"
    body = [k for k in base if k != embed]
    moved = sum(int((step1[k] != base[k]).sum()) for k in body) / sum(base[k].numel() for k in body)
    assert moved >= 0.99, f"only {moved:.2%} of the non-embedding weights moved in step 1 at lr 1e-6"
    rows_moved = int((step1[embed] != base[embed]).any(dim=1).sum())
    assert rows_moved > 0, "no embedding row moved in step 1 at lr 1e-6"
    # The last sync (before step 3) carried step 2's masters, cast to the bf16 vLLM serves.
    sent = weights(tmp_path / "volume" / "weight-sync" / "v000003")
    assert {t.dtype for t in sent.values()} == {torch.bfloat16}
    assert all(torch.equal(sent[k], step2[k].to(torch.bfloat16)) for k in sent), "vLLM got other weights"


def test_asynchronous_grpo_trains_on_groups_one_step_stale_stamped_with_their_weights(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer, served_tiny: vllm_server.VLLMProcess
) -> None:
    """spec.grpo.maxStaleness 1 through the real vLLM server: vLLM samples step s+1's groups while the trainer
    trains step s. Step 1 samples with the weights it trains (nothing was trained before it); later steps
    train on groups sampled up to one step earlier, each stamped with its sampling version, and the
    importance-sampling correction sees the difference between the two policies."""
    steps = 5
    run_trainer(tmp_path, tiny_model, toy_metric, served_tiny, steps=steps, maxStaleness=1)

    rows = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    # The version is the number of optimizer steps the sampling weights held. A later step's groups are
    # requested as soon as the look-ahead sees its prompts, while the step before trains; on a loaded
    # machine a request can still start only after that step's push, and is then stamped fresh (staleness
    # 0), which the bound allows. Sampling ahead must happen, though.
    assert (rows[0]["policy_version"], rows[0]["staleness"]) == (0, 0), rows
    check_async_rows(rows, eta=1)
    assert any(r["staleness"] == 1 for r in rows[1:]), rows
    assert all(r["dropped_reason"] is None for r in rows), rows
    assert all(0.0 <= r["generation_overlap_ratio"] <= 1.0 for r in rows), rows
    # Later steps' groups were sampled while earlier steps trained.
    assert sum(r["generation_overlap_seconds"] for r in rows[:-1]) > 0, rows
    # Each group sampled ahead was scored as soon as it was back, and the step used those scores: the item
    # scored ahead (completion decoded as TRL decodes it, dataset row, length, finish reason) was the one
    # the step's reward function would have sent.
    ahead = [r for r in rows if r["group_versions"]]
    assert ahead and all(r["groups_scored_ahead"] == r["rollouts"] for r in ahead), rows

    # One push per step, each between requests: the served weights always matched the trainer's at the push.
    syncs = read_jsonl(tmp_path / "out" / "weight_syncs.jsonl")
    assert [s["step"] for s in syncs] == list(range(steps)), syncs
    assert all(s["in_sync"] and s["logprob_diff"] < SAME for s in syncs), syncs

    # The correction compares the trained policy with the sampling one: equal at step 1 but for the two
    # engines' numerics, a step apart later (learning rate 0.02 moves the tiny model visibly each step).
    def spread(row: dict[str, Any]) -> float:
        return float(row["importance_sampling_ratio_max"]) - float(row["importance_sampling_ratio_min"])

    print("importance ratio spread by step:", [round(spread(r), 4) for r in rows])
    assert max(spread(r) for r in rows[1:]) > spread(rows[0]), rows

    log = (tmp_path / "trainer.log").read_text()
    assert "sampled ahead were dropped" not in log, log[-3000:]


def test_asynchronous_grpo_at_the_numerics_users_get_moves_the_weights_it_serves(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer, served_tiny: vllm_server.VLLMProcess
) -> None:
    """maxStaleness 1 at the numerics a GRPOJob gets by default (model.dtype bfloat16 over fp32 masters, the
    spec's learning rate): groups sampled ahead, scored as they came back, train a step that moves nearly
    every non-embedding weight, and vLLM serves each step's weights."""
    from tests.trainer.weights import load_weights

    run_trainer(
        tmp_path, tiny_model, toy_metric, served_tiny, dtype="bfloat16", maxStaleness=1,
        learningRate=PRODUCTION_LR,
    )  # fmt: skip

    rows = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    check_async_rows(rows, eta=1)
    ahead = [r for r in rows if r["group_versions"]]
    assert ahead and all(r["groups_scored_ahead"] == r["rollouts"] for r in ahead), rows
    syncs = read_jsonl(tmp_path / "out" / "weight_syncs.jsonl")
    assert [s["step"] for s in syncs] == [0, 1, 2] and all(s["in_sync"] for s in syncs), syncs
    step1, step3 = (load_weights(tmp_path / "ckpt" / f"step-{n}") for n in (1, 3))
    # The embedding is left out: only the rows of sampled tokens get a gradient.
    body = [k for k in step1 if k != "model.embed_tokens.weight"]
    moved = sum(int((step3[k] != step1[k]).sum()) for k in body) / sum(step1[k].numel() for k in body)
    assert moved >= 0.99, (
        f"only {moved:.2%} of the non-embedding weights moved in steps 2-3 at lr {PRODUCTION_LR}"
    )


def test_the_importance_ratio_that_reaches_the_loss_is_trained_over_sampling_policy(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer, served_tiny: vllm_server.VLLMProcess
) -> None:
    """The correction of asynchronous GRPO, exactly: for every step, the per-answer importance ratio TRL
    applied equals exp(log p_trained - log p_sampling), recomputed here from the checkpoints of the version
    the step's groups were stamped with (sampling) and of the step before (trained). A wrong stamp, or
    groups sampled with other weights than stamped, gives other ratios. B = 2 so that samples.jsonl holds
    every answer of a step; sequence_truncate with a cap of 1000 leaves every ratio as it is."""
    from grpo_operator.api.grpo_spec import GRPOSpec

    steps = 4
    run_trainer(
        tmp_path, tiny_model, toy_metric, served_tiny, steps=steps, maxStaleness=1, promptsPerStep=2,
        vllmImportanceSamplingMode="sequence_truncate", vllmImportanceSamplingCap=1000.0,
    )  # fmt: skip
    rows = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    check_async_rows(rows, eta=1)
    samples = [s for s in read_jsonl(tmp_path / "out" / "samples.jsonl") if s["split"] == "train"]
    temperature = float(GRPOSpec.model_fields["temperature"].default)

    def weights(version: int) -> Path:
        return tiny_model if version == 0 else tmp_path / "ckpt" / f"step-{version}"

    for row in rows:
        step = row["step"]
        answers = [s for s in samples if s["step"] == step]
        assert len(answers) == 2 * 8 and all(s["completionIds"] for s in answers), answers
        trained = sequence_logprobs(weights(step - 1), answers, temperature)
        # Each answer under the weights its group was sampled on (a push that interrupted the step's
        # sampling leaves groups of two versions, each group of one).
        # (None: sampled on the spot, with the step's one version.)
        groups = row["group_versions"] or [row["policy_version"]] * 2
        versions = [groups[i // 8] for i in range(len(answers))]
        under = {v: sequence_logprobs(weights(v), answers, temperature) for v in set(versions)}
        sampled = [under[v][i] for i, v in enumerate(versions)]
        ratios = [math.exp(t - s) for t, s in zip(trained, sampled, strict=True)]
        expected = (min(ratios), sum(ratios) / len(ratios), max(ratios))
        logged = (
            row["importance_sampling_ratio_min"],
            row["importance_sampling_ratio_mean"],
            row["importance_sampling_ratio_max"],
        )
        print(f"step {step} (versions {row['group_versions']}, {row['groups_resampled']} groups resampled): "
              f"logged {logged}, from the checkpoints {expected}")  # fmt: skip
        assert logged == pytest.approx(expected, rel=2e-3, abs=1e-4), (step, logged, expected)
    # The later steps were a version behind, and the ratios show it.
    assert (
        max(r["importance_sampling_ratio_max"] - r["importance_sampling_ratio_min"] for r in rows[1:]) > 0.05
    )


def test_a_push_aborts_a_later_steps_groups_on_the_server_and_has_them_sampled_again(
    served_tiny: vllm_server.VLLMProcess,
) -> None:
    """The producer's group sampler against the real server, at maxStaleness 2: step 3 is sampled on version
    0, a short group (2 tokens) and a long one (480 tokens, end-of-sequence ignored). Once the short group
    is back, the push of version 1 (the trainer starting step 2) interrupts step 3, which the trainer does
    not need yet: vLLM's /abort_requests ends the long group's request at once (finish reason "abort"),
    the push goes ahead, and the long group is sampled again, whole, under version 1; the short one keeps
    the version it was sampled on."""
    import urllib.request

    from grpo_trainer.async_rollouts import RolloutProducer
    from grpo_trainer.group_sampling import GroupSampler, StepRequest

    served = {"version": 0}
    finished: list[tuple[int, int, list[str]]] = []
    model = json.loads(urllib.request.urlopen(f"{served_tiny.base_url}/v1/models", timeout=10).read())[
        "data"
    ][0]["id"]

    def generate_one(prompt: list[int]) -> dict[str, Any]:
        long = prompt[0] == 7
        version = served["version"]
        body = {"model": model, "prompt": [prompt], "n": 4, "max_tokens": 480 if long else 2,
                "ignore_eos": True, "return_token_ids": True}  # fmt: skip
        choices = served_tiny.post("/v1/completions", body, timeout=300)["choices"]
        finished.append((prompt[0], version, [c["finish_reason"] for c in choices]))
        return {"prompt_ids": [prompt], "completion_ids": [c["token_ids"] for c in choices], "logprobs": None}

    sampler = GroupSampler(
        generate_one, version=lambda: served["version"], server_urls=lambda: [served_tiny.base_url],
        concurrency=4,
    )  # fmt: skip
    producer = RolloutProducer(sampler, max_staleness=2, interrupt=sampler.interrupt)
    try:
        with producer.pushing(version=0):
            pass
        step = StepRequest([[5, 6], [7, 8]])
        producer.submit(3, step.prompts, request=step)
        deadline = time.monotonic() + 60
        while 0 not in step.results:
            assert time.monotonic() < deadline, finished
            time.sleep(0.01)
        with producer.pushing(version=1):
            served["version"] = 1
        assert producer.interrupted == 1
        taken = producer.take(3, step.prompts)
    finally:
        producer.close()
        sampler.close()
    assert taken.rollout is not None
    sampled = taken.rollout.payload
    assert sampled.versions == [0, 1] and sampled.resampled == 1
    assert [len(ids) for ids in sampled.payload[1]] == [2] * 4 + [480] * 4
    # The long group's first request was cut short by the abort; its second ran to the end.
    long_runs = [(version, reasons) for first, version, reasons in finished if first == 7]
    assert long_runs[0] == (0, ["abort"] * 4) and long_runs[-1] == (1, ["length"] * 4), finished
    assert taken.staleness == 2 and taken.rollout.version == 0


def test_asynchronous_grpo_under_torchrun_two_steps_ahead(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer, served_tiny: vllm_server.VLLMProcess
) -> None:
    """Two trainer processes (the launch of a 2-GPU trainer pod): every rank reads ahead and gathers its
    prompts to rank 0, whose thread samples them; each step's groups are broadcast and sliced, and
    validation (which samples in between) leaves the sampled-ahead groups alone."""
    steps = 4
    config = vllm_config(
        tmp_path, tiny_model, toy_metric, served_tiny, steps, every_steps=4, maxStaleness=2, promptsPerStep=4
    )
    body = json.loads(config.read_text())
    body["trainer"].update(perDeviceBatchSize=4, gpusPerNode=2)
    body["grpo"]["validation"] = {"everySteps": 2, "maxPrompts": 4}
    config.write_text(json.dumps(body))
    command = torchrun_command(2)
    result = subprocess.run(
        command, cwd=REPO, env=trainer_env(config), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-4000:]
    rows = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert all(r["rollouts"] == 4 * 8 and r["groups"] == 4 for r in rows), rows
    check_async_rows(rows, eta=2)
    assert rows[0]["staleness"] == 0 and max(r["staleness"] for r in rows) >= 1, rows
    assert "validation_mean" in rows[1] and "validation_mean" in rows[3], rows
    # One push per step, and validation's at the last step (the weights of step 4), each between requests.
    syncs = read_jsonl(tmp_path / "out" / "weight_syncs.jsonl")
    assert [s["step"] for s in syncs] == list(range(steps + 1)) and all(s["in_sync"] for s in syncs), syncs


def test_fsdp_gathers_the_sharded_weights_into_both_vllm_replicas_after_every_step(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer, served_tiny: vllm_server.VLLMProcess
) -> None:
    """spec.trainer.sharding FSDP, two ranks, spec.generation.replicas 2: each sync gathers the sharded fp32
    masters one parameter at a time on every rank and rank 0 writes them, in bf16, to the volume both vLLM
    servers reload from; the trainer's probe (a forward of the sharded model on every rank) finds both
    serving them after every step."""
    import torch
    from safetensors.torch import load_file

    steps = 3
    second = serve(tiny_model, tmp_path / "replica-1")
    try:
        config = vllm_config(tmp_path, tiny_model, toy_metric, served_tiny, steps)
        body = json.loads(config.read_text())
        body["model"]["dtype"] = "bfloat16"
        body["trainer"].update(perDeviceBatchSize=4, gpusPerNode=2, sharding="FSDP")
        body["generation"]["serverUrls"] = [served_tiny.base_url, second.base_url]
        config.write_text(json.dumps(body))
        command = torchrun_command(2)
        result = subprocess.run(
            command, cwd=REPO, env=trainer_env(config), capture_output=True, text=True, timeout=600
        )
    finally:
        second.stop()
    assert result.returncode == 0, result.stderr[-4000:]
    assert [r["step"] for r in read_jsonl(tmp_path / "out" / "metrics.jsonl")] == [1, 2, 3]
    syncs = read_jsonl(tmp_path / "out" / "weight_syncs.jsonl")
    assert [s["step"] for s in syncs] == [0, 1, 2], syncs
    assert all(s["in_sync"] and s["logprob_diff"] < SAME for s in syncs), syncs
    for record in syncs:
        assert record["replicas"]["serving"] == [0, 1], record
        assert max(record["replicas"]["logprob_diff"].values()) < SAME, record
    sent = {
        k: v
        for f in (tmp_path / "volume" / "weight-sync" / "v000003").glob("*.safetensors")
        for k, v in load_file(str(f)).items()
    }
    base = {k: v for k, v in load_file(str(tiny_model / "model.safetensors")).items()}
    # Whole tensors, not shards, in bf16, and trained away from the base model.
    assert {k: tuple(v.shape) for k, v in sent.items()} == {k: tuple(v.shape) for k, v in base.items()}
    assert {v.dtype for v in sent.values()} == {torch.bfloat16}
    assert any(not torch.equal(sent[k], base[k].to(torch.bfloat16)) for k in base)
    served = served_logprobs(served_tiny, PROBE_IDS)
    from transformers import AutoModelForCausalLM

    assert (
        mean_diff(served, trained_logprobs(AutoModelForCausalLM.from_pretrained(tiny_model), PROBE_IDS))
        > 2 * SAME
    )


def test_asynchronous_grpo_killed_with_groups_in_flight_resumes_on_the_same_prompts(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer, served_tiny: vllm_server.VLLMProcess
) -> None:
    """SIGKILL while groups of later steps are sampled ahead: the resumed trainer starts from the checkpoint,
    samples the lost steps again and trains each step once, on the prompts an uninterrupted run trains."""
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    for workdir in (straight, killed):
        workdir.mkdir()
    steps = 10
    run_trainer(straight, tiny_model, toy_metric, served_tiny, steps=steps, maxStaleness=1)

    config = vllm_config(killed, tiny_model, toy_metric, served_tiny, steps, every_steps=3, maxStaleness=1)
    process = start_trainer(config, killed / "killed.log")
    deadline = time.monotonic() + 600
    while len(read_jsonl(killed / "out" / "metrics.jsonl")) < 4 and process.poll() is None:
        assert time.monotonic() < deadline, "step 4 never came"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    trained_before = len(read_jsonl(killed / "out" / "metrics.jsonl"))
    checkpoint = json.loads((killed / "ckpt" / "latest.json").read_text())["step"]
    assert checkpoint < trained_before < steps, (checkpoint, trained_before)

    resumed = start_trainer(config, killed / "resumed.log")
    assert resumed.wait(timeout=600) == 0, (killed / "resumed.log").read_text()[-4000:]
    rows = read_jsonl(killed / "out" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, steps + 1)), rows  # each step once
    check_async_rows(rows, eta=1)
    # The resumed attempt's first step sampled with the checkpoint's weights, the ones it trains.
    first = rows[checkpoint]
    assert (first["policy_version"], first["staleness"]) == (checkpoint, 0), first
    assert train_prompts(killed) == train_prompts(straight)


def test_the_dashboards_vllm_queries_read_what_this_vllm_exports(
    served_tiny: vllm_server.VLLMProcess,
) -> None:
    """The Grafana dashboard's vLLM panels query vLLM's own metrics, which the Prometheus end-to-end test
    cannot scrape (it runs no vLLM server): the names they use are checked here against the /metrics of
    the vLLM build the tests run, after it served a request, so a metric renamed by a vLLM release shows
    here rather than as an empty panel on a user's cluster."""
    dashboard = json.loads((CHART / "files" / "dashboards" / "grpo-operator.json").read_text())
    wanted = {
        name
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        for name in metric_names(target["expr"])
        if name.startswith("vllm:")
    }
    assert len(wanted) >= 6, wanted
    name = json.loads(get_text(served_tiny.base_url + "/v1/models"))["data"][0]["id"]
    served_tiny.post("/v1/completions", {"model": name, "prompt": "the", "max_tokens": 4})
    samples = exported_samples(get_text(served_tiny.base_url + "/metrics"))
    assert not wanted - samples.keys(), f"not exported by this vLLM: {sorted(wanted - samples.keys())}"
    # The request above is counted where the token and request panels read it.
    assert samples["vllm:generation_tokens_total"] >= 4 and samples["vllm:request_success_total"] >= 1, (
        samples
    )


# Scaled alpha/r = 8 over every attention projection: three steps must move the served model well clear of the
# base (at alpha 16 on q and v alone, one run in CI moved it by 0.074, under the 2 * SAME asked).
def test_a_served_model_that_misses_the_update_is_reported_as_drifted(
    tmp_path: Path, toy_metric: MetricServer
) -> None:
    from grpo_trainer.tiny import build

    # A tied output layer: vLLM's CPU build reloads the embedding but keeps serving the old output layer.
    model = build(tmp_path / "tied-model", tie_embeddings=True)
    server = serve(model, tmp_path / "vllm")
    try:
        run_trainer(tmp_path / "run", model, toy_metric, server, learningRate=0.3)
    finally:
        server.stop()
    syncs = read_jsonl(tmp_path / "run" / "out" / "weight_syncs.jsonl")
    # The first sync pushes the base weights, which vLLM already serves; after a step they differ.
    assert syncs[0]["in_sync"], syncs
    assert not syncs[-1]["in_sync"] and syncs[-1]["logprob_diff"] > 0.2, syncs
    log = (tmp_path / "run" / "trainer.log").read_text()
    assert "vLLM is not serving the weights being trained" in log


def test_two_replicas_share_the_sampling_and_a_lost_one_rejoins_with_the_current_weights(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer, served_tiny: vllm_server.VLLMProcess
) -> None:
    """spec.generation.replicas: 2 through two real vLLM servers (the module's as replica 0, one of its own as
    replica 1). Both sample every step and serve the trained weights after every sync; replica 1 SIGKILLed
    mid-run leaves the trainer process running on replica 0, and its replacement on the same address
    reloads the current weights before it is sent any work."""
    container = vllm_server.rendered_container(str(tiny_model), weightSync="Volume")
    env = {**vllm_server.container_env(container), "HF_HOME": str(tmp_path / "hf")}
    second = serve(tiny_model, tmp_path / "replica-1")
    config = vllm_config(tmp_path, tiny_model, toy_metric, served_tiny, steps=2000, every_steps=1000)
    data = json.loads(config.read_text())
    data["generation"]["serverUrls"] = [served_tiny.base_url, second.base_url]
    config.write_text(json.dumps(data))
    trainer = start_trainer(config, tmp_path / "trainer.log")

    records, killed_at, rejoined_at, replacement = kill_replica_until_it_rejoins(
        tmp_path, trainer, second, container, env
    )
    # Before the kill both replicas served, both sampled, and both held the trained weights at every sync.
    for record in records[:killed_at]:
        assert record["replicas"]["serving"] == [0, 1], record
        assert set(record["replicas"]["logprob_diff"]) == {"0", "1"}, record
        assert max(record["replicas"]["logprob_diff"].values()) < SAME, record
    assert all(n > 0 for n in records[killed_at - 1]["replicas"]["requests"]), records[killed_at - 1]
    # While replica 1 was away the steps went on with replica 0 alone, in the same trainer process.
    away = records[killed_at:rejoined_at]
    assert away and all(r["replicas"]["serving"] == [0] for r in away), away
    rows = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1)), rows
    assert len(rows) >= len(records) - 1
    assert (tmp_path / "trainer.log").read_text().count("Traceback") == 0
    # Back: the rejoined replica held the trained weights from its first sync on, and sampled again.
    for record in records[rejoined_at:]:
        assert record["replicas"]["serving"] == [0, 1], record
        assert max(record["replicas"]["logprob_diff"].values()) < SAME, record
    assert records[-1]["replicas"]["requests"][1] > records[rejoined_at]["replicas"]["requests"][1]
    # The replacement was sent no completion before its first reload of the trainer's weights.
    log = replacement.log.read_text(errors="replace")
    first_reload = log.find('"POST /collective_rpc HTTP/1.1" 200')
    first_completion = log.find('"POST /v1/completions HTTP/1.1"')
    assert 0 <= first_reload < first_completion, log[-3000:]
