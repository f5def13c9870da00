"""LoRA jobs through real vLLM (the CPU build): adapter-only sync to a server started as the operator renders
it for a LoRA job (--enable-lora, runtime adapter loading), at a learning rate that moves the served model
visibly and at the numerics users get; and the merged fallback against a server without adapter routes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from grpo_metric import MetricServer

from tests.harness import vllm_server
from tests.trainer.toy import read_jsonl, start_trainer
from tests.trainer.vllm_runs import (
    PROBE_IDS,
    PRODUCTION_LR,
    SAME,
    get_text,
    mean_diff,
    run_trainer,
    serve,
    served_logprobs,
    trained_logprobs,
    vllm_config,
)

pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.vllm]

LORA = {
    "enabled": True,
    "r": 8,
    "alpha": 64,
    "dropout": 0.0,
    "targetModules": ["q_proj", "k_proj", "v_proj", "o_proj"],
}


def test_lora_sends_only_the_adapter_and_vllm_serves_it_after_every_step(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer
) -> None:
    """A LoRA job's vLLM server as the operator renders it (--enable-lora, runtime adapter loading): each
    sync writes the adapter alone and vLLM samples from it under a new name; the base model is never sent."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    server = serve(tiny_model, tmp_path / "vllm", lora=LORA)
    try:
        run_trainer(tmp_path, tiny_model, toy_metric, server, lora=LORA, learningRate=0.1)
        served_adapter = served_logprobs(server, PROBE_IDS, "lora-000003")
        served_base = served_logprobs(server, PROBE_IDS)
        models = [m["id"] for m in json.loads(get_text(server.base_url + "/v1/models"))["data"]]
        # The same server, a job at the numerics users get: bf16 over fp32 masters, the spec's learning rate.
        production = tmp_path / "production"
        config = vllm_config(
            production, tiny_model, toy_metric, server, steps=2, lora=LORA, learningRate=PRODUCTION_LR
        )
        data = json.loads(config.read_text())
        data["model"]["dtype"] = "bfloat16"
        config.write_text(json.dumps(data))
        process = start_trainer(config, production / "trainer.log")
        assert process.wait(timeout=900) == 0, (production / "trainer.log").read_text()[-4000:]
    finally:
        server.stop()
    production_syncs = read_jsonl(production / "out" / "weight_syncs.jsonl")
    assert all(s["weights"] == "adapter" and s["in_sync"] for s in production_syncs), production_syncs
    # LoRA's B matrices start at zero; step 1 moves nearly all of them at lr 1e-6 (fp32 masters).
    from tests.trainer.weights import load_weights

    adapter = load_weights(production / "ckpt" / "step-1")
    b = [v for k, v in adapter.items() if "lora_B" in k]
    moved = sum(int((v != 0).sum()) for v in b) / sum(v.numel() for v in b)
    assert b and moved >= 0.99, f"only {moved:.2%} of LoRA's B weights moved in step 1 at lr {PRODUCTION_LR}"

    syncs = read_jsonl(tmp_path / "out" / "weight_syncs.jsonl")
    assert [s["step"] for s in syncs] == [0, 1, 2], syncs
    assert all(s["weights"] == "adapter" and s["in_sync"] and s["logprob_diff"] < SAME for s in syncs), syncs
    # Every sync moved the adapter's files and nothing else: what the newest version holds, a tenth of the
    # tiny model's weights (32 kB of 329 kB; a far smaller share of a real model's).
    sync_dir = tmp_path / "volume" / "weight-sync"
    adapter_bytes = sum(f.stat().st_size for f in (sync_dir / "lora-000003").iterdir())
    model_bytes = sum(f.stat().st_size for f in tiny_model.glob("*.safetensors"))
    assert all(s["bytes"] == adapter_bytes for s in syncs) and 10 * adapter_bytes < model_bytes, (
        syncs,
        model_bytes,
    )
    # The newest adapter and the one before stay loaded and on the volume; older ones were unloaded.
    assert sorted(p.name for p in sync_dir.iterdir()) == ["lora-000002", "lora-000003"]
    assert models[1:] == ["lora-000002", "lora-000003"], models

    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    base_logprobs = trained_logprobs(base, PROBE_IDS)
    merged = PeftModel.from_pretrained(base, tmp_path / "ckpt" / "step-2").merge_and_unload()
    to_merged, to_base = (
        mean_diff(served_adapter, trained_logprobs(merged, PROBE_IDS)),
        mean_diff(served_adapter, base_logprobs),
    )
    # The newest adapter serves the weights of step 2, clearly not the base; the base model vLLM started
    # with is unchanged (no weight of it was pushed).
    assert to_merged < SAME and to_base > SAME and to_base > 10 * to_merged, (to_merged, to_base)
    assert mean_diff(served_base, base_logprobs) < SAME
    assert "LoRA adapter synced through" in (tmp_path / "trainer.log").read_text()


def test_lora_against_a_vllm_that_cannot_load_adapters_pushes_the_merged_model(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer, served_tiny: vllm_server.VLLMProcess
) -> None:
    """The module's server has no adapter routes (started as for full fine-tuning): the first adapter is
    refused, the job says why and pushes the merged model every step, still served as trained."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_trainer(tmp_path, tiny_model, toy_metric, served_tiny, lora=LORA, learningRate=0.1)

    syncs = read_jsonl(tmp_path / "out" / "weight_syncs.jsonl")
    assert [s["step"] for s in syncs] == [0, 1, 2] and all(s["in_sync"] for s in syncs), syncs
    assert all(s["weights"] == "model" for s in syncs), syncs
    log = (tmp_path / "trainer.log").read_text()
    assert "adapter-only LoRA sync is off for this run" in log and "HTTP 404" in log, log[-3000:]

    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    base_logprobs = trained_logprobs(base, PROBE_IDS)
    merged = PeftModel.from_pretrained(base, tmp_path / "ckpt" / "step-2").merge_and_unload()
    served = served_logprobs(served_tiny, PROBE_IDS)
    to_merged, to_base = (
        mean_diff(served, trained_logprobs(merged, PROBE_IDS)),
        mean_diff(served, base_logprobs),
    )
    # Served as merged (vLLM and transformers agree to ~1e-7 here), and clearly not as the base (0.18 here).
    assert to_merged < SAME and to_base > SAME and to_base > 10 * to_merged, (to_merged, to_base)
