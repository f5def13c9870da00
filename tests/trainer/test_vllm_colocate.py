"""The trainer with a real vLLM engine inside its own process (generation.backend vllm-colocate, TRL's colocate
mode), on PyPI's CPU build of vLLM: the trainer runs with the python of hack/vllm-colocate-env.sh, as a
trainer image that carries vLLM would. Generation goes through the engine, the weights reach it in memory
before every step's generation, and each sync is checked with the engine's own log-probabilities against
the training model's and recorded in weight_syncs.jsonl.

One trainer process, so one engine start (~1-3 minutes of CPU with imports, warm compile cache).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from grpo_metric import MetricServer

from tests.harness import vllm_server
from tests.trainer.toy import REPO, read_jsonl, trainer_config, trainer_env

pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.vllm]

# The engine serves trainer.json's model.dtype, float32 here, like the trainer: the probe's mean |difference|
# is ~1e-7 (an engine left at vLLM's "auto" would serve bfloat16, 1e-3 to 1e-2 on this model).
SAME = 1e-4
STEPS = 3


def probe_logprobs(model_dir: Path, tokenizer_dir: Path) -> list[float]:
    """The model's log-probability of each token of the trainer's probe text after the first."""
    from grpo_trainer.weight_sync import ServedModelProbe
    from transformers import AutoModelForCausalLM, AutoTokenizer

    probe = ServedModelProbe(AutoTokenizer.from_pretrained(tokenizer_dir))
    return probe.trained_logprobs(AutoModelForCausalLM.from_pretrained(model_dir))


def mean_diff(a: list[float], b: list[float]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / len(a)


def run_colocated(tmp_path: Path, model: Path, metric: MetricServer, **generation: Any) -> Path:
    """A run of STEPS steps whose last step is followed by validation (which syncs the final weights into
    the engine before it samples), checkpointing every step."""
    config = trainer_config(
        tmp_path, model, metric.url, steps=STEPS, every_steps=1, keep_last=STEPS + 1, validation_every=STEPS
    )
    data = json.loads(config.read_text())
    data["generation"] = {"backend": "vllm-colocate", **generation}
    config.write_text(json.dumps(data))
    python, env = vllm_server.colocated_trainer(sys.executable, trainer_env(config))
    log = tmp_path / "trainer.log"
    started = time.monotonic()
    with log.open("wb") as handle:
        process = subprocess.Popen(
            [python, "-m", "grpo_trainer"], cwd=REPO, env=env, stdout=handle, stderr=handle
        )
        code = process.wait(timeout=840)
    print(f"colocated trainer: {time.monotonic() - started:.0f}s")
    assert code == 0, log.read_text(errors="replace")[-6000:]
    return tmp_path


def test_colocated_engine_samples_every_step_and_serves_the_trained_weights(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer
) -> None:
    run_colocated(tmp_path, tiny_model, toy_metric, colocateMemoryShare=0.3, maxModelLen=64)
    log = (tmp_path / "trainer.log").read_text(errors="replace")

    # Sampled by the vLLM engine in the trainer's process, not by transformers: the engine started there with
    # trainer.json's context length, and TRL logged the importance ratios between the engine's sampling
    # log-probabilities and the trained model's, which exist only for vLLM samples.
    assert "colocated vLLM engine started" in log and "dtype float32, max_model_len 64" in log, log[-4000:]
    rows = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), rows
    assert all("importance_sampling_ratio_mean" in r for r in rows), rows
    assert all(r["rollouts"] == 4 * 8 for r in rows), rows
    assert "validation_mean" in rows[-1], rows[-1]

    # One sync before each step's generation (steps 0, 1, 2) and one before the final validation (step 3),
    # each probed against the engine: it served the weights being trained every time.
    syncs = read_jsonl(tmp_path / "out" / "weight_syncs.jsonl")
    print("syncs:", syncs)
    assert [s["step"] for s in syncs] == list(range(STEPS + 1)), syncs
    assert all(s["transport"] == "colocate" and s["in_sync"] for s in syncs), syncs
    assert all(s["logprob_diff"] < SAME for s in syncs), syncs
    assert "served model matches the trained one" in log

    # After the last step the engine served the final weights (the last probe), and those differ from the
    # base model's visibly: a sync that had not reached the engine would have shown the base model's.
    final = probe_logprobs(tmp_path / "out" / "model", tiny_model)
    base = probe_logprobs(tiny_model, tiny_model)
    moved = mean_diff(final, base)
    print(f"final vs base model on the probe: {moved:.4f}; engine vs final: {syncs[-1]['logprob_diff']:.4f}")
    assert moved > 0.1, moved
    assert syncs[-1]["logprob_diff"] < SAME, (syncs[-1], moved)
