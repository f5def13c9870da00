"""Helpers of the trainer tests against a real vLLM server (PyPI's CPU build): starting one as the operator
renders it, reading its log-probabilities, and a trainer run that generates through it."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo_metric import MetricServer
from grpo_operator.api.grpo_spec import GRPOSpec

from tests.harness import openenv_env, vllm_server
from tests.harness.ports import free_port
from tests.trainer.toy import REPO, start_trainer, trainer_config

# vLLM serves bfloat16 weights of a float32 trainer: the probe's mean |difference| stays near 0.01.
SAME = 0.05


def serve(
    model: Path, workdir: Path, lora: dict[str, Any] | None = None, weight_sync: str = "Volume"
) -> vllm_server.VLLMProcess:
    """A server of ``model`` as the operator renders it for a job syncing through ``weight_sync`` (with
    spec.grpo.lora ``lora``: one that loads the trainer's adapters). A server rendered for Broadcast reloads
    from the volume too: the two differ by the weight-transfer engine it starts, which Volume never calls."""
    container = vllm_server.rendered_container(str(model), lora=lora, weightSync=weight_sync)
    env = {**vllm_server.container_env(container), "HF_HOME": str(workdir / "hf")}
    server = vllm_server.start(container, env, free_port(), workdir / "vllm.log")
    try:
        server.wait_healthy(900)
    except BaseException:
        server.stop()
        raise
    return server


def served_logprobs(server: vllm_server.VLLMProcess, ids: list[int], name: str | None = None) -> list[float]:
    """vLLM's log-probability of each token of ``ids`` after the first, from the base model or the adapter
    ``name``."""
    name = name or json.loads(get_text(server.base_url + "/v1/models"))["data"][0]["id"]
    answer = server.post(
        "/v1/completions", {"model": name, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0}
    )
    entries = answer["choices"][0]["prompt_logprobs"][1:]
    return [entry[str(token)]["logprob"] for token, entry in zip(ids[1:], entries, strict=True)]


def get_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as response:
        return str(response.read().decode())


def trained_logprobs(model: Any, ids: list[int]) -> list[float]:
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits.float()
    logprobs = torch.log_softmax(logits[0, :-1], dim=-1)
    return [float(x) for x in logprobs.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]]


def mean_diff(a: list[float], b: list[float]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / len(a)


PROBE_IDS = list(range(3, 40))
# The learning rate a GRPOJob trains at unless its spec says otherwise (1e-6).
PRODUCTION_LR = float(GRPOSpec.model_fields["learning_rate"].default)


def vllm_config(
    tmp_path: Path,
    model: Path,
    metric: MetricServer,
    server: vllm_server.VLLMProcess,
    steps: int = 3,
    every_steps: int = 1,
    **grpo: Any,
) -> Path:
    """trainer.json of a run that generates through ``server`` and syncs weights through the volume."""
    port = int(server.base_url.rsplit(":", 1)[1])
    config = trainer_config(
        tmp_path, model, metric.url, steps=steps, every_steps=every_steps, keep_last=steps + 2
    )
    data = json.loads(config.read_text())
    data["generation"] = {
        "backend": "vllm-server",
        "serverHost": "127.0.0.1",
        "serverPort": port,
        "startupTimeoutSeconds": 60,
        "weightSync": "volume",
        "weightSyncDir": str(tmp_path / "volume" / "weight-sync"),
    }
    data["grpo"].update(grpo)
    config.write_text(json.dumps(data))
    return config


def run_trainer(
    tmp_path: Path,
    model: Path,
    metric: MetricServer,
    server: vllm_server.VLLMProcess,
    steps: int = 3,
    dtype: str | None = None,
    generation: dict[str, Any] | None = None,
    **grpo: Any,
) -> Path:
    """A trainer run through ``server`` to its end (exit 0); ``dtype``: the model.dtype it trains in (unset:
    the test config's float32); ``generation``: trainer.json generation fields replacing the volume sync's
    (a ``weightSync`` other than volume drops ``weightSyncDir``)."""
    config = vllm_config(tmp_path, model, metric, server, steps, **grpo)
    data = json.loads(config.read_text())
    if dtype is not None:
        data["model"]["dtype"] = dtype
    if generation:
        data["generation"].update(generation)
        if data["generation"]["weightSync"] != "volume":
            del data["generation"]["weightSyncDir"]
    config.write_text(json.dumps(data))
    process = start_trainer(config, tmp_path / "trainer.log")
    assert process.wait(timeout=900) == 0, (tmp_path / "trainer.log").read_text()[-4000:]
    return tmp_path


def sequence_logprobs(model_dir: Path, samples: list[dict[str, Any]], temperature: float) -> list[float]:
    """Each sample's completion log-probability under the weights in ``model_dir``: the sum over its tokens,
    at the sampling temperature, as TRL and vLLM compute it."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = []
    with torch.no_grad():
        for sample in samples:
            prompt, completion = sample["promptIds"], sample["completionIds"]
            logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].float() / temperature
            logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
            out.append(float(logprobs.gather(1, torch.tensor(completion)[:, None]).sum()))
    return out


def check_async_rows(rows: list[dict[str, Any]], eta: int) -> None:
    """Each step's groups within the bound and stamped consistently: version + staleness = step - 1, the
    step's version its oldest group's, every group's version within the bound."""
    for row in rows:
        assert 0 <= row["staleness"] <= eta, row
        assert row["policy_version"] + row["staleness"] == row["step"] - 1, row
        assert row["groups_dropped"] == 0, row
        versions = row.get("group_versions")
        if versions:
            assert min(versions) == row["policy_version"] and max(versions) == row["policy_version_newest"], (
                row
            )
            assert all(row["step"] - 1 - eta <= v <= row["step"] - 1 for v in versions), row


def exported_samples(text: str) -> dict[str, float]:
    """Each sample name of a Prometheus text exposition with the sum of its values over label sets."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
    return samples


def environment_config(
    tmp_path: Path,
    model: Path,
    metric: MetricServer,
    server: vllm_server.VLLMProcess,
    url: str,
    steps: int,
    with_metric: bool = False,
    **environment: Any,
) -> Path:
    """trainer.json of an environment job (2 prompts x 2 episodes a step) sampling through ``server``, at
    the numerics a GRPOJob gets by default: bf16 compute over fp32 masters, learning rate 1e-6."""
    config = vllm_config(
        tmp_path, model, metric, server, steps=steps, maxCompletionLength=64, learningRate=PRODUCTION_LR
    )
    data = json.loads(config.read_text())
    data["model"]["dtype"] = "bfloat16"
    if not with_metric:  # else the metric scores each episode's final answer too
        del data["metric"]
    data["grpo"].update(groupSize=2, promptsPerStep=2)
    data["trainer"]["perDeviceBatchSize"] = 2
    data["environment"] = {"url": url, "timeoutSeconds": 30, **environment}
    config.write_text(json.dumps(data))
    return config


CALCULATOR = REPO / "examples" / "environments" / "calculator"


def serve_calculator(tmp_path: Path) -> openenv_env.EnvironmentProcess:
    """The calculator environment of examples/, served as its image serves it."""
    return openenv_env.serve(CALCULATOR, free_port(), tmp_path / "env.log", app="calculator_env:app")


def calculator_config(
    tmp_path: Path,
    model: Path,
    metric: MetricServer,
    server: vllm_server.VLLMProcess,
    url: str,
    steps: int,
    **grpo: Any,
) -> Path:
    """trainer.json of a job whose episodes run against the calculator: up to 3 turns of at most 6 tokens,
    4 episodes at a time; ``grpo`` overrides spec.grpo fields."""
    config = environment_config(
        tmp_path, model, metric, server, url, steps=steps,
        maxTurns=3, maxTurnTokens=6, maxObservationTokens=12, observationField="text", concurrency=4,
    )  # fmt: skip
    data = json.loads(config.read_text())
    data["grpo"].update(grpo)
    config.write_text(json.dumps(data))
    return config


def train_logging_every_episode(config: Path, tmp_path: Path) -> None:
    """Run the environment job of ``config`` to its end (exit 0), every episode of every step logged."""
    process = start_trainer(config, tmp_path / "trainer.log", GRPO_EPISODES_LOGGED_PER_STEP="100")
    assert process.wait(timeout=900) == 0, (tmp_path / "trainer.log").read_text()[-4000:]


def syncs_until(
    run: Path, trainer: subprocess.Popen[bytes], done: Callable[[list[dict[str, Any]]], bool], timeout: float
) -> list[dict[str, Any]]:
    """The records of ``run``'s output/weight_syncs.jsonl once ``done`` holds for them (complete lines only:
    the trainer may be writing the next one); fails when the trainer exits or ``timeout`` passes first."""
    sync_log = run / "out" / "weight_syncs.jsonl"
    deadline = time.monotonic() + timeout
    while True:
        text = sync_log.read_text() if sync_log.exists() else ""
        records = [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]
        if done(records):
            return records
        assert trainer.poll() is None, (run / "trainer.log").read_text()[-4000:]
        assert time.monotonic() < deadline, records[-3:]
        time.sleep(0.2)


def kill_replica_until_it_rejoins(
    run: Path,
    trainer: subprocess.Popen[bytes],
    replica: vllm_server.VLLMProcess,
    container: dict[str, Any],
    env: dict[str, str],
) -> tuple[list[dict[str, Any]], int, int, vllm_server.VLLMProcess]:
    """After 3 syncs SIGKILLs ``replica`` (vLLM replica 1 of ``trainer``'s run), starts its replacement on the
    same address, waits for the sync at which it rejoined and 3 more, then stops the trainer with SIGTERM
    (it must exit 0). Returns every sync record, the index of the first sync after the kill, the index of
    the rejoining sync, and the replacement (stopped, its log kept)."""
    port = int(replica.base_url.rsplit(":", 1)[1])
    replacement: vllm_server.VLLMProcess | None = None
    try:
        killed_at = len(syncs_until(run, trainer, lambda r: len(r) >= 3, 600))
        replica.stop(grace=0)  # SIGKILL: its in-flight request, if any, fails as a lost connection
        replacement = vllm_server.start(container, env, port, run / "replica-1b" / "vllm.log")
        records = syncs_until(run, trainer, lambda r: any(1 in s["replicas"]["rejoined"] for s in r), 900)
        rejoined_at = next(i for i, s in enumerate(records) if 1 in s["replicas"]["rejoined"])
        syncs_until(run, trainer, lambda r: len(r) >= rejoined_at + 3, 300)
        trainer.send_signal(signal.SIGTERM)
        assert trainer.wait(timeout=300) == 0, (run / "trainer.log").read_text()[-4000:]
    finally:
        if trainer.poll() is None:
            trainer.kill()
        replica.stop()
        if replacement is not None:
            replacement.stop()
    records = [json.loads(line) for line in (run / "out" / "weight_syncs.jsonl").read_text().splitlines()]
    return records, killed_at, rejoined_at, replacement
