"""What the vLLM server of a LoRA job needs to serve the trainer's adapter (adapter-only weight sync).

A LoRA job with spec.generation.weightSync Volume has the trainer write each step's adapter (megabytes, not
the whole model) to the shared volume and load it into vLLM under a new name through
``POST /v1/load_lora_adapter``; vLLM serves that route only with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` set and
serves adapters only when started with ``--enable-lora``. Without them (NCCL transport, or a rank above vLLM's
largest) the server gets nothing here, and the trainer pushes the merged model every step as before.
"""

from __future__ import annotations

from grpo_operator.api.spec import GRPOJobSpec

# The ranks vLLM 0.31 accepts for --max-lora-rank (vllm/config/lora.py MaxLoRARanks); an adapter of rank r
# needs the smallest one >= r.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# Two adapters per batch: with maxStaleness, groups sampled on the previous adapter are still running when
# the next one is loaded; with one slot vLLM would hold the new requests until they finish.
MAX_LORAS = 2
RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def lora_max_rank(spec: GRPOJobSpec) -> int | None:
    """The --max-lora-rank that serves this job's adapter, or None when vLLM serves no adapter for it."""
    lora = spec.grpo.lora
    if not lora.enabled or spec.generation.weight_sync != "Volume":
        return None
    return next((rank for rank in VLLM_LORA_RANKS if rank >= lora.r), None)


def lora_serving_args(spec: GRPOJobSpec) -> list[str]:
    rank = lora_max_rank(spec)
    if rank is None:
        return []
    return ["--enable-lora", "--max-lora-rank", str(rank), "--max-loras", str(MAX_LORAS)]


def lora_serving_env(spec: GRPOJobSpec) -> dict[str, str]:
    return {RUNTIME_LORA_ENV: "True"} if lora_max_rank(spec) is not None else {}
