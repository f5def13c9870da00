"""One weight sync to N real vLLM servers (PyPI's CPU build), by broadcast and through the volume, for the same
model: seconds per sync (median), bytes sent, and whether every server then serves the sent weights.

    .venv/bin/python bench/weight_sync_transports.py [--replicas 2] [--hidden 512 --layers 8] [--syncs 8]

The servers are started as the operator renders them for weightSync Broadcast (the project's engine
loaded; the volume's reload needs nothing of it), so both transports reach the same processes. Each sync
sends fresh weights (the base plus noise, bf16 as vLLM serves them): Volume writes safetensors shards once
and has every server reload them (the trainer's VolumeSyncClient and ReplicaPool); Broadcast forms one gloo
group of this process and every server's worker and sends each tensor once (BroadcastReplicaPool). The
first sync of each transport is reported apart: it includes the broadcast group's formation.

On this machine the servers and this process share 2 cores and the "volume" is the local disk: the figures
compare the two paths' own costs, not a cluster's network or storage.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "operator"), str(REPO / "trainer_image")]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=512, help="hidden size of the model synced")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--syncs", type=int, default=8, help="syncs per transport")
    args = parser.parse_args()

    import torch
    from grpo_trainer.tiny import build
    from grpo_trainer.vllm_replicas import ReplicaPool
    from grpo_trainer.vllm_wait import vllm_healthy
    from grpo_trainer.weight_broadcast import BroadcastReplicaPool, broadcast_client_class
    from grpo_trainer.weight_sync import volume_sync_client_class
    from transformers import AutoModelForCausalLM

    from tests.harness.ports import free_port
    from tests.trainer.vllm_runs import mean_diff, serve, served_logprobs, trained_logprobs

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = build(work / "model", hidden_size=args.hidden, layers=args.layers, seed=0)
        model: Any = AutoModelForCausalLM.from_pretrained(model_dir)
        parameters = sum(p.numel() for p in model.parameters())
        print(f"model: hidden {args.hidden}, {args.layers} layers, {parameters:,} parameters", flush=True)
        started = time.monotonic()
        servers = [
            serve(model_dir, work / f"vllm-{r}", weight_sync="Broadcast") for r in range(args.replicas)
        ]
        print(f"{args.replicas} vLLM servers up in {time.monotonic() - started:.0f}s", flush=True)
        ids = list(range(3, 40))
        try:
            volume_clients = [volume_sync_client_class()(s.base_url, str(work / "sync")) for s in servers]
            volume: object = ReplicaPool(volume_clients, vllm_healthy)
            volume.init_communicator()  # type: ignore[attr-defined]
            broadcast = BroadcastReplicaPool(
                [broadcast_client_class()(s.base_url) for s in servers], vllm_healthy, free_port(), 120.0
            )
            results = {}
            for name, pool in (("volume", volume), ("broadcast", broadcast)):
                seconds: list[float] = []
                for _ in range(args.syncs):
                    with torch.no_grad():
                        for p in model.parameters():
                            p.add_(torch.randn_like(p) * 0.01)
                    sent = [(n, p.detach().to(torch.bfloat16)) for n, p in model.named_parameters()]
                    meta = [(n, "bfloat16", list(t.shape)) for n, t in sent]
                    begin = time.monotonic()
                    pool.update_named_params(meta, iter(sent))  # type: ignore[attr-defined]
                    pool.reset_prefix_cache()  # type: ignore[attr-defined]
                    seconds.append(time.monotonic() - begin)
                trained = trained_logprobs(model.to(torch.bfloat16).float(), ids)
                model = model.float()
                worst = max(mean_diff(served_logprobs(s, ids), trained) for s in servers)
                results[name] = (seconds, int(pool.last_sync_bytes), worst)  # type: ignore[attr-defined]
            print()
            print(
                f"| transport | replicas | bytes per sync | first sync s | median s (syncs 2-{args.syncs}) | served vs sent |"
            )
            print("|---|---:|---:|---:|---:|---:|")
            for name, (seconds, nbytes, worst) in results.items():
                print(
                    f"| {name} | {args.replicas} | {nbytes:,} | {seconds[0]:.3f} | "
                    f"{statistics.median(seconds[1:]):.3f} | {worst:.4f} |"
                )
        finally:
            for server in servers:
                server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
