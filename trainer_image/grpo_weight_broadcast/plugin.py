"""vLLM's entry point into this package (``vllm.general_plugins``): vLLM calls :func:`register` in each of its
processes at start-up, before a worker creates its weight-transfer engine."""

from __future__ import annotations

# The name vLLM's --weight-transfer-config selects the engine by.
BACKEND = "grpo-broadcast"


def register() -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    # vLLM loads general plugins once per process, but a second call (a plugin loaded twice) must not fail.
    if BACKEND in WeightTransferEngineFactory._registry:
        return
    WeightTransferEngineFactory.register_engine(
        BACKEND, "grpo_weight_broadcast.vllm_engine", "BroadcastWeightTransferEngine"
    )
