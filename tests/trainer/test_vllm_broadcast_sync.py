"""spec.generation.weightSync: Broadcast through two real vLLM servers (PyPI's CPU build) carrying the
project's plugin: trainer rank 0 and both servers' workers form one gloo group (the project's
grpo-broadcast engine in vLLM), and every sync sends each tensor once to both. The module's shared server
(conftest's served_tiny, rendered for Broadcast) is replica 0; replica 1 is started here.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from grpo_metric import MetricServer

from tests.harness import vllm_server
from tests.harness.ports import free_port
from tests.trainer.toy import read_jsonl, start_trainer
from tests.trainer.vllm_runs import (
    PRODUCTION_LR,
    SAME,
    kill_replica_until_it_rejoins,
    run_trainer,
    serve,
    vllm_config,
)

pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.vllm]


def test_broadcast_reaches_both_replicas_every_step_and_a_replaced_one_rejoins_the_group(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer, served_tiny: vllm_server.VLLMProcess
) -> None:
    """Both replicas serve the trained weights after every broadcast (the trainer's probe against each);
    replica 1 SIGKILLed mid-run leaves the same trainer process going on replica 0 alone (a group formed
    again without it), and its replacement on the same address joins a new formation and receives the
    current weights before it is sent any completion."""
    container = vllm_server.rendered_container(str(tiny_model), weightSync="Broadcast")
    assert '{"backend":"grpo-broadcast"}' in container["args"]
    env = {**vllm_server.container_env(container), "HF_HOME": str(tmp_path / "hf")}
    second = serve(tiny_model, tmp_path / "replica-1", weight_sync="Broadcast")
    config = vllm_config(tmp_path, tiny_model, toy_metric, served_tiny, steps=2000, every_steps=1000)
    data = json.loads(config.read_text())
    del data["generation"]["weightSyncDir"]
    data["generation"].update(
        weightSync="broadcast",
        weightSyncPort=free_port(),
        serverUrls=[served_tiny.base_url, second.base_url],
        # A lost member must break the broadcast at once (connection reset), never by this timeout.
        requestTimeoutSeconds=120,
    )
    config.write_text(json.dumps(data))
    trainer = start_trainer(config, tmp_path / "trainer.log")

    records, killed_at, rejoined_at, replacement = kill_replica_until_it_rejoins(
        tmp_path, trainer, second, container, env
    )
    log = (tmp_path / "trainer.log").read_text()
    assert all(r["transport"] == "broadcast" for r in records), records
    # Each sync sends the whole model once, whatever the number of replicas: the same bytes every time.
    assert len({r["bytes"] for r in records if not r.get("after_replacement")}) == 1, records
    for record in records[:killed_at]:
        assert record["replicas"]["serving"] == [0, 1], record
        assert max(record["replicas"]["logprob_diff"].values()) < SAME, record
    away = records[killed_at:rejoined_at]
    assert away and all(r["replicas"]["serving"] == [0] for r in away), away
    for record in records[rejoined_at:]:
        assert record["replicas"]["serving"] == [0, 1], record
        assert max(record["replicas"]["logprob_diff"].values()) < SAME, record
    assert records[-1]["replicas"]["requests"][1] > records[rejoined_at]["replicas"]["requests"][1]
    # One trainer process throughout: steps numbered without a restart.
    rows = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1)), rows
    # The group was formed with both replicas, again with replica 0 alone, and again with both.
    formations = re.findall(r"weight-broadcast group (\d+) formed \(gloo, (\d+) members", log)
    sizes = [int(members) for _, members in formations]
    assert sizes[0] == 3 and 2 in sizes and sizes[-1] == 3, formations
    # The replacement joined the group and received the weights before its first completion.
    served = replacement.log.read_text(errors="replace")
    first_update = served.find('"POST /finish_weight_update HTTP/1.1" 200')
    first_completion = served.find('"POST /v1/completions HTTP/1.1"')
    assert 0 <= first_update < first_completion, served[-3000:]


def test_an_update_broken_off_halfway_leaves_the_server_whole_for_the_next_one(
    tiny_model: Path, served_tiny: vllm_server.VLLMProcess
) -> None:
    """Rank 0 gives up after half the buckets (a trainer killed, a tensor that fails its check): the server
    stays up, its receive fails instead of hanging, the sync fails as a lost server would, and the next
    update, over a new formation of the group, leaves vLLM serving exactly the sent weights. An update left
    open by a trainer that died is closed by the next one."""
    import torch
    from grpo_trainer.vllm_wait import vllm_healthy
    from grpo_trainer.weight_broadcast import (
        BroadcastInterrupted,
        BroadcastReplicaPool,
        broadcast_client_class,
    )
    from transformers import AutoModelForCausalLM

    from tests.trainer.vllm_runs import PROBE_IDS, mean_diff, served_logprobs, trained_logprobs

    model: Any = AutoModelForCausalLM.from_pretrained(tiny_model)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    sent = [(name, p.detach().to(torch.bfloat16)) for name, p in model.named_parameters()]
    metadata = [(name, "bfloat16", list(t.shape)) for name, t in sent]
    client = broadcast_client_class()(served_tiny.base_url, timeout=60)
    pool = BroadcastReplicaPool([client], vllm_healthy, free_port(), 60.0)
    pool.bucket_bytes = 4096  # the tiny model in many buckets, so half of them arrive

    def broken() -> Any:
        for index, pair in enumerate(sent):
            if index == len(sent) // 2:
                raise RuntimeError("rank 0 gives up mid-update")
            yield pair

    started = time.monotonic()
    with pytest.raises(BroadcastInterrupted, match="rank 0 gives up"):
        pool.update_named_params(metadata, broken())
    assert time.monotonic() - started < 30, "the receiver waited for the group's timeout"
    assert vllm_healthy(served_tiny.base_url)
    pool.update_named_params(metadata, iter(sent))
    client.reset_prefix_cache()
    assert pool.formations == 2 and pool.last_sync_bytes == sum(t.numel() * 2 for _, t in sent)
    rounded = model.to(torch.bfloat16).float()
    assert mean_diff(served_logprobs(served_tiny, PROBE_IDS), trained_logprobs(rounded, PROBE_IDS)) < SAME

    # A trainer killed right after opening an update leaves it open on a server the operator keeps; the
    # next trainer's pool closes it and sends the whole model.
    client.weight_route("/start_weight_update")
    pool.close_communicator()
    successor = BroadcastReplicaPool([client], vllm_healthy, free_port(), 60.0)
    successor.update_named_params(metadata, iter(sent))
    client.reset_prefix_cache()
    assert mean_diff(served_logprobs(served_tiny, PROBE_IDS), trained_logprobs(rounded, PROBE_IDS)) < SAME


def test_broadcast_at_the_numerics_users_get_serves_the_moving_bf16_weights(
    tmp_path: Path, tiny_model: Path, toy_metric: MetricServer, served_tiny: vllm_server.VLLMProcess
) -> None:
    """model.dtype bfloat16 over fp32 masters at the spec's default learning rate, weights broadcast: nearly
    every non-embedding master moves over steps 2-3, every sync sends the model once in bf16 (2 bytes a
    parameter, never the fp32 masters), and vLLM serves each step's weights."""
    from tests.trainer.weights import load_weights

    config_edit = {
        "weightSync": "broadcast",
        "weightSyncPort": free_port(),
        "serverUrls": [served_tiny.base_url],
    }
    run_trainer(
        tmp_path, tiny_model, toy_metric, served_tiny, dtype="bfloat16", generation=config_edit,
        learningRate=PRODUCTION_LR,
    )  # fmt: skip
    syncs = read_jsonl(tmp_path / "out" / "weight_syncs.jsonl")
    assert [s["step"] for s in syncs] == [0, 1, 2], syncs
    assert all(s["transport"] == "broadcast" and s["in_sync"] for s in syncs), syncs
    step1, step3 = (load_weights(tmp_path / "ckpt" / f"step-{n}") for n in (1, 3))
    assert {s["bytes"] for s in syncs} == {2 * sum(t.numel() for t in step1.values())}, syncs
    body = [k for k in step1 if k != "model.embed_tokens.weight"]
    moved = sum(int((step3[k] != step1[k]).sum()) for k in body) / sum(step1[k].numel() for k in body)
    assert moved >= 0.99, f"only {moved:.2%} of the non-embedding weights moved in steps 2-3"
