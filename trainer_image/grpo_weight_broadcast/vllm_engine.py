"""The vLLM side of the weight broadcast: a weight-transfer engine (vLLM's ``WeightTransferEngine``), registered
as ``grpo-broadcast`` by the plugin (plugin.py) and selected with
``--weight-transfer-config '{"backend":"grpo-broadcast"}'``.

vLLM's own NCCL engine serves one trainer and one server: its rank offset is whatever the trainer sends, but
TRL's client always sends 1, and it needs CUDA. This engine joins the project's group (group.py) at the rank
offset the trainer gives each replica, over gloo or NCCL as the trainer says, so one trainer rank 0 feeds
every worker of every replica with one broadcast per tensor. It runs in each vLLM worker process; the
trainer drives it through vLLM's weight routes (``/init_weight_transfer_engine``, ``/start_weight_update``,
``/update_weights``, ``/finish_weight_update``).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from grpo_weight_broadcast.group import BUCKET_BYTES, BroadcastGroup, buckets, open_group, unpack

log = logging.getLogger("grpo_weight_broadcast")


@dataclass
class BroadcastInitInfo(WeightTransferInitInfo):  # type: ignore[misc]
    """What the trainer sends to ``/init_weight_transfer_engine`` for one replica."""

    master_address: str
    master_port: int
    # This replica's first rank in the group: 1 + the workers of the replicas before it.
    rank_offset: int
    world_size: int
    backend: str = "gloo"
    # Which formation of the group this is (group.open_group): a new one each time the trainer re-forms it.
    formation: int = 0
    timeout_seconds: float = 600.0
    # The packing of consecutive tensors into one broadcast (group.buckets); the trainer's choice.
    bucket_bytes: int = BUCKET_BYTES


@dataclass
class BroadcastUpdateInfo(WeightTransferUpdateInfo):  # type: ignore[misc]
    """One update's tensors, in the order rank 0 broadcasts them."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                f"update_info lists differ in length: {len(self.names)} names, {len(self.dtype_names)} dtypes, "
                f"{len(self.shapes)} shapes"
            )


class BroadcastWeightTransferEngine(WeightTransferEngine[BroadcastInitInfo, BroadcastUpdateInfo]):  # type: ignore[misc]
    init_info_cls = BroadcastInitInfo
    update_info_cls = BroadcastUpdateInfo

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: BroadcastGroup | None = None
        self.bucket_bytes = BUCKET_BYTES

    def init_transfer_engine(self, init_info: BroadcastInitInfo) -> None:
        """Joins the group; a group this worker was in before (a replica replaced, a new trainer attempt) is
        left first, so the trainer can re-form it as often as it needs."""
        if init_info.backend == "nccl" and self.device.type != "cuda":
            raise ValueError(
                f"the trainer asked for an NCCL weight broadcast but this vLLM worker runs on {self.device}; "
                "NCCL needs CUDA on both sides (a trainer without CUDA broadcasts over gloo)"
            )
        self.shutdown()
        self.bucket_bytes = init_info.bucket_bytes
        parallel = self.parallel_config
        worker = parallel.data_parallel_index * parallel.world_size + parallel.rank
        rank = init_info.rank_offset + worker
        started = time.monotonic()
        self.group = open_group(
            init_info.master_address,
            init_info.master_port,
            rank,
            init_info.world_size,
            init_info.backend,
            init_info.timeout_seconds,
            init_info.formation,
        )
        log.info(
            "joined weight-broadcast formation %d as rank %d of %d (%s, rendezvous %s:%d) in %.2fs",
            init_info.formation,
            rank,
            init_info.world_size,
            init_info.backend,
            init_info.master_address,
            init_info.master_port,
            time.monotonic() - started,
        )

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class ends with torch.accelerator.synchronize(), which raises on a machine without an
        # accelerator; gloo's broadcast is complete when it returns.
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def receive_weights(self, update_info: BroadcastUpdateInfo) -> None:
        group = self.group
        if group is None:
            raise RuntimeError(
                "no weight-broadcast group: the trainer must call /init_weight_transfer_engine before "
                "/update_weights"
            )
        device = self.device if group.backend == "nccl" else torch.device("cpu")
        dtypes = []
        for name, dtype_name in zip(update_info.names, update_info.dtype_names, strict=True):
            dtype = getattr(torch, dtype_name, None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"update_info names dtype {dtype_name!r} for {name}, which torch lacks")
            dtypes.append(dtype)
        sizes = [
            math.prod(shape) * dtype.itemsize for dtype, shape in zip(dtypes, update_info.shapes, strict=True)
        ]
        for bucket in buckets(sizes, self.bucket_bytes):
            buffer = torch.empty(sum(sizes[i] for i in bucket), dtype=torch.uint8, device=device)
            group.broadcast(buffer)
            tensors = unpack(buffer, [dtypes[i] for i in bucket], [update_info.shapes[i] for i in bucket])
            self.model.load_weights([(update_info.names[i], t) for i, t in zip(bucket, tensors, strict=True)])

    def shutdown(self) -> None:
        group, self.group = self.group, None
        if group is not None:
            group.close()
