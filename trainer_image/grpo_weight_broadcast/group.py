"""The weight-broadcast process group, the same code on both sides: trainer rank 0 (the sender, rank 0 of the
group, which hosts the rendezvous) and every worker of every vLLM replica (ranks from each replica's offset).

Only torch is needed here: the trainer image carries no vLLM, and the vLLM image imports this module from its
engine (vllm_engine.py). The group is built from a TCPStore and a process-group object of its own, never
through ``torch.distributed.init_process_group``: the trainer's own default group (DDP/FSDP between the
trainer ranks) and vLLM's (tensor parallelism between its workers) stay untouched.

The backend follows the device: NCCL where the tensors live on CUDA (the trainer sends from its GPU, the
workers receive on theirs), gloo on the CPU. Gloo connects every pair of members (a full mesh of TCP
connections on ephemeral ports), NCCL likewise or over RDMA; the rendezvous itself is one port on rank 0.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

# Consecutive tensors are sent packed into one buffer of at most this many bytes (a larger tensor alone):
# one collective per bucket instead of one per tensor, which for the hundreds of small tensors of a model
# (norms, biases) costs a round trip each.
BUCKET_BYTES = 64 << 20

# Prefix of the group's keys in the rendezvous store: every formation of the group (a replica replaced, a new
# trainer attempt) uses its own, so a member of an earlier one never reads a key of the current one.
STORE_PREFIX = "grpo-weight-broadcast"


def buckets(sizes: list[int], limit: int = BUCKET_BYTES) -> list[range]:
    """The tensors (by index, in order) each broadcast carries, from their sizes in bytes: both sides compute
    it from the same announced metadata, so they agree on every buffer's size without sending it."""
    out: list[range] = []
    start = total = 0
    for index, size in enumerate(sizes):
        if index > start and total + size > limit:
            out.append(range(start, index))
            start, total = index, 0
        total += size
    if sizes:
        out.append(range(start, len(sizes)))
    return out


def pack(tensors: list[Any]) -> Any:
    """The tensors' bytes, one after another, as one flat uint8 tensor (on the tensors' device)."""
    import torch

    return torch.cat([t.contiguous().view(-1).view(torch.uint8) for t in tensors])


def unpack(buffer: Any, dtypes: list[Any], shapes: list[list[int]]) -> list[Any]:
    """The tensors ``pack`` put into ``buffer``, as views of it where alignment allows."""
    import math

    out = []
    offset = 0
    for dtype, shape in zip(dtypes, shapes, strict=True):
        size = math.prod(shape) * dtype.itemsize
        part = buffer[offset : offset + size]
        # A view needs its offset aligned to the dtype's size; the rare tensor that follows an odd-sized one
        # is copied out instead.
        out.append((part if offset % dtype.itemsize == 0 else part.clone()).view(dtype).view(shape))
        offset += size
    return out


def backend_for(device: Any) -> str:
    """nccl for CUDA tensors, gloo for everything else."""
    return "nccl" if str(device).startswith("cuda") else "gloo"


@dataclass
class BroadcastGroup:
    """One formation of the group, as seen by one member."""

    rank: int
    world_size: int
    backend: str
    process_group: Any
    store: Any

    def broadcast(self, tensor: Any) -> None:
        """``tensor`` from rank 0 to every member, in place on the receivers; raises when a member is lost
        or the group's timeout passes (a dead member never hangs the sender)."""
        import torch.distributed as dist

        options = dist.BroadcastOptions()
        options.rootRank = 0
        options.rootTensor = 0
        self.process_group.broadcast([tensor], options).wait()

    def close(self) -> None:
        """Leaves the group; NCCL's communicator is aborted so a peer that died mid-broadcast cannot hold it."""
        group, self.process_group, self.store = self.process_group, None, None
        if group is None:
            return
        for name in ("abort", "shutdown"):
            stop = getattr(group, name, None)
            if callable(stop):
                # A group whose peers are gone may refuse a clean shutdown.
                with contextlib.suppress(Exception):
                    stop()
                return


def open_group(
    host: str,
    port: int,
    rank: int,
    world_size: int,
    backend: str,
    timeout_seconds: float,
    formation: int,
) -> BroadcastGroup:
    """Joins formation ``formation`` of the group at ``host``:``port`` as ``rank`` of ``world_size``; rank 0
    serves the rendezvous. Blocks until every member has joined, or raises after ``timeout_seconds``."""
    import torch.distributed as dist

    if backend not in ("gloo", "nccl"):
        raise ValueError(f"weight-broadcast backend {backend!r}: expected gloo or nccl")
    timeout = timedelta(seconds=timeout_seconds)
    store = dist.TCPStore(  # type: ignore[attr-defined]
        host_name=host,
        port=port,
        world_size=world_size,
        is_master=rank == 0,
        timeout=timeout,
        wait_for_workers=False,
    )
    name = f"{STORE_PREFIX}/{formation}"
    prefixed = dist.PrefixStore(name, store)  # type: ignore[attr-defined]
    if backend == "nccl":
        nccl_options = dist.ProcessGroupNCCL.Options()
        nccl_options._timeout = timeout
        group: Any = dist.ProcessGroupNCCL(prefixed, rank, world_size, nccl_options)
    else:
        gloo_options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        gloo_options._timeout = timeout
        # The interface a platform names for gloo (as torch.distributed itself reads it); else the one the
        # host name resolves to, which in a pod is the pod's address.
        interfaces = [i for i in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if i]
        gloo_options._devices = (
            [dist.ProcessGroupGloo.create_device(interface=i) for i in interfaces]
            if interfaces
            else [dist.ProcessGroupGloo.create_default_device()]
        )
        group = dist.ProcessGroupGloo(prefixed, rank, world_size, gloo_options)
    return BroadcastGroup(rank, world_size, backend, group, store)
