"""Weight sync by broadcast (spec.generation.weightSync: Broadcast): trainer rank 0 sends each tensor once to
every worker of every vLLM replica, over one process group (grpo_weight_broadcast.group: gloo without CUDA,
NCCL with it) that the project's vLLM plugin (engine ``grpo-broadcast``) joins from each worker.

The group's members are rank 0 and the workers of the replicas that receive the weights: replica i's first
worker sits at rank 1 + the workers of the replicas before it. A group has a fixed size, so when that set of
replicas changes (a replica lost, its replacement answering again, a new trainer attempt beside kept
servers) the group is formed again with the replicas that answer, under a new formation number; the
replacement then receives the current weights with everyone else before it is sent any work.

One update: ``/start_weight_update`` on every receiver, then ``/update_weights`` (the tensors' names, dtypes
and shapes) posted to every receiver at once while rank 0 broadcasts the tensors in that order, then
``/finish_weight_update``. A receiver lost meanwhile breaks the broadcast for everyone (a collective); the
sync then fails as a lost server (BroadcastInterrupted), and the trainer's recovery forms the group again with
the replicas that answer and pushes the whole update again.
"""

from __future__ import annotations

import logging
import math
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from grpo_weight_broadcast.group import BUCKET_BYTES, buckets, pack

from grpo_trainer.vllm_replicas import NoReplicaServing, Replica, ReplicaPool
from grpo_trainer.vllm_wait import lost_server
from grpo_trainer.weight_sync import WeightSyncError, vllm_session

log = logging.getLogger("grpo_trainer.weight_broadcast")

# The engine the project's vLLM plugin registers (grpo_weight_broadcast.plugin.BACKEND).
ENGINE = "grpo-broadcast"


class BroadcastInterrupted(ConnectionError):
    """A member of the group was lost during a broadcast: to the trainer, a lost server (it waits for the
    replicas that answer and pushes the weights again)."""


def local_address_towards(base_url: str) -> str:
    """This host's address on the route to ``base_url``'s host: where the vLLM workers reach rank 0's
    rendezvous (a pod's own IP in a cluster, 127.0.0.1 for a server on this machine). No packet is sent."""
    parts = urlsplit(base_url)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((parts.hostname or "127.0.0.1", parts.port or 80))
        return str(probe.getsockname()[0])


def _itemsize(dtype: str) -> int:
    import torch

    return int(getattr(torch, dtype).itemsize)


def broadcast_client_class() -> type[Any]:
    """The per-replica client, built on first use (TRL's VLLMClient is imported only by jobs that use vLLM)."""
    from trl.generation.vllm_client import VLLMClient

    class BroadcastSyncClient(VLLMClient):  # type: ignore[misc, valid-type]
        """TRL's VLLMClient for generation, with vLLM's weight routes driven for the broadcast group. Like
        the volume client it sets TRL's attributes itself: TRL's constructor insists on the vllm package,
        which only its own NCCL transport needs."""

        def __init__(self, base_url: str, connection_timeout: float = 0.0, timeout: float = 600.0) -> None:
            import requests

            self.session = vllm_session()
            # A plain session, never retrying: a repeated /update_weights would wait for a broadcast that
            # rank 0 will not send again.
            self.weight_session = requests.Session()
            self.base_url = base_url.rstrip("/")
            self.host = base_url
            self.group_port = 0
            self.communicator = None
            self._updating_weights = False
            self.timeout = timeout
            self.check_server(connection_timeout)
            self.model = self._get(f"{self.base_url}/v1/models")["data"][0]["id"]

        def workers(self) -> int:
            """The server's workers (tensor x pipeline x data parallel), each a member of the group."""
            return int(self._get(f"{self.base_url}/get_world_size")["world_size"])

        def weight_route(self, route: str, body: dict[str, Any] | None = None) -> None:
            """POSTs one of vLLM's weight routes; WeightSyncError with vLLM's answer when it refused,
            raised from the request's error when the server was not reached."""
            import requests

            try:
                # A connection of its own each time: vLLM closes one it answered 500 on, and a pooled
                # connection it closed would fail the next route (routes are not retried, above).
                response = self.weight_session.post(
                    f"{self.base_url}{route}",
                    json=body or {},
                    timeout=self.timeout,
                    headers={"Connection": "close"},
                )
            except requests.RequestException as exc:
                raise WeightSyncError(
                    f"the vLLM server at {self.base_url} did not answer {route} ({type(exc).__name__}: {exc})"
                ) from exc
            if response.status_code != 200:
                hint = ""
                if route == "/init_weight_transfer_engine":
                    hint = (
                        f". weightSync Broadcast needs the project's generation image, which carries the "
                        f"{ENGINE} plugin, started with --weight-transfer-config "
                        f'\'{{"backend":"{ENGINE}"}}\' (the operator renders the flag)'
                    )
                raise WeightSyncError(
                    f"the vLLM server at {self.base_url} refused {route} "
                    f"(HTTP {response.status_code}: {response.text[:500]}){hint}"
                )

        def init_communicator(self, device: Any = 0) -> None:
            return None

        def close_communicator(self) -> None:
            return None

    return BroadcastSyncClient


class BroadcastReplicaPool(ReplicaPool):
    """The job's vLLM replicas (vllm_replicas.ReplicaPool's generation and bookkeeping), with the weights
    broadcast to them (see the module)."""

    def __init__(
        self,
        clients: list[Any],
        healthy: Any,
        port: int,
        timeout_seconds: float,
        device: Any = "cpu",
    ) -> None:
        super().__init__(clients, healthy)
        self.port = port
        self.timeout_seconds = timeout_seconds
        self.device = device
        self.group: Any = None
        self.members: tuple[int, ...] = ()
        self.formations = 0
        self.last_sync_bytes_sent = 0
        self.last_formation_seconds = 0.0
        self.bucket_bytes = BUCKET_BYTES

    @property
    def last_sync_bytes(self) -> int:
        return self.last_sync_bytes_sent

    @property
    def backend(self) -> str:
        from grpo_weight_broadcast.group import backend_for

        return backend_for(self.device)

    def init_communicator(self, device: Any = None) -> None:
        """The next update forms the group anew (a new trainer attempt, or after a lost member)."""
        if device is not None:
            self.device = device
        self.close_communicator()

    def close_communicator(self) -> None:
        group, self.group, self.members = self.group, None, ()
        if group is not None:
            group.close()

    def update_adapter(self, model: Any) -> None:
        raise WeightSyncError(
            "adapter-only LoRA sync goes through the volume (weightSync Volume); a broadcast job pushes the "
            "merged model"
        )

    def update_named_params(
        self, metadata: list[tuple[str, str, list[int]]], named_params: Iterator[tuple[str, Any]]
    ) -> None:
        started = time.monotonic()
        receivers = self._receivers()
        if not receivers:
            raise NoReplicaServing(f"no vLLM replica answers to receive the weights: {self.describe()}")
        if self.group is None or self.members != tuple(r.index for r in receivers):
            self._form(receivers)
        try:
            self._send(receivers, metadata, named_params)
        except Exception as exc:
            # The group is unusable after a failed collective: the next update (the recovery's) forms it
            # again with the replicas that answer then.
            self.close_communicator()
            for replica in receivers:
                if not self._healthy(replica.base_url):
                    self.leave(replica, exc)
                else:
                    # A receiver that got every tensor before another member broke off still holds an
                    # open update, which vLLM would refuse to start again.
                    self._finish_quietly(replica)
            if isinstance(exc, WeightSyncError) and not lost_server(exc):
                raise
            raise BroadcastInterrupted(
                f"the weight broadcast to {len(receivers)} vLLM replicas broke off ({type(exc).__name__}: "
                f"{str(exc)[:300]}); {self.describe()}"
            ) from exc
        with self._lock:
            self.rejoined = [r.index for r in receivers if not r.serving]
            for replica in receivers:
                replica.serving = True
        for index in self.rejoined:
            log.warning(
                "vLLM replica %d at %s answers again and received the current weights by broadcast: it "
                "serves again",
                index,
                self.replicas[index].base_url,
            )
        log.info(
            "weights broadcast (%s) to %d of %d vLLM replicas: %.2f MB in %.2fs",
            self.backend,
            len(receivers),
            len(self.replicas),
            self.last_sync_bytes_sent / 1e6,
            time.monotonic() - started,
        )

    def _form(self, receivers: list[Replica]) -> None:
        """A new formation of the group: rank 0 here, each receiver's workers from its offset."""
        from grpo_weight_broadcast.group import open_group

        self.close_communicator()
        started = time.monotonic()
        sizes = [r.client.workers() for r in receivers]
        world_size = 1 + sum(sizes)
        address = local_address_towards(receivers[0].base_url)
        formation = self.formations
        self.formations += 1
        offsets = [1 + sum(sizes[:i]) for i in range(len(receivers))]
        with ThreadPoolExecutor(max_workers=len(receivers)) as pool:
            joins = [
                pool.submit(
                    r.client.weight_route,
                    "/init_weight_transfer_engine",
                    {
                        "init_info": {
                            "master_address": address,
                            "master_port": self.port,
                            "rank_offset": offset,
                            "world_size": world_size,
                            "backend": self.backend,
                            "formation": formation,
                            "timeout_seconds": self.timeout_seconds,
                            "bucket_bytes": self.bucket_bytes,
                        }
                    },
                )
                for r, offset in zip(receivers, offsets, strict=True)
            ]
            try:
                group = open_group(
                    address, self.port, 0, world_size, self.backend, self.timeout_seconds, formation
                )
            except Exception as exc:
                for join in joins:
                    if join.done() and join.exception() is not None:
                        raise join.exception() from exc  # type: ignore[misc]
                raise BroadcastInterrupted(
                    f"the vLLM replicas did not join the weight-broadcast group at {address}:{self.port} "
                    f"within {self.timeout_seconds:.0f}s ({type(exc).__name__}: {str(exc)[:300]})"
                ) from exc
            try:
                for join in joins:
                    join.result()
            except BaseException:
                group.close()
                raise
        self.group, self.members = group, tuple(r.index for r in receivers)
        self.last_formation_seconds = time.monotonic() - started
        log.info(
            "weight-broadcast group %d formed (%s, %d members: rank 0 and replicas %s at offsets %s) in %.2fs",
            formation,
            self.backend,
            world_size,
            list(self.members),
            offsets,
            self.last_formation_seconds,
        )

    def _send(
        self,
        receivers: list[Replica],
        metadata: list[tuple[str, str, list[int]]],
        named_params: Iterator[tuple[str, Any]],
    ) -> None:
        update_info = {
            "names": [name for name, _, _ in metadata],
            "dtype_names": [dtype for _, dtype, _ in metadata],
            "shapes": [list(shape) for _, _, shape in metadata],
        }
        self._on_each(receivers, self._start)
        sizes = [math.prod(shape) * _itemsize(dtype) for _, dtype, shape in metadata]
        plan = buckets(sizes, self.bucket_bytes)
        sent = 0
        with ThreadPoolExecutor(max_workers=len(receivers)) as pool:
            loads = [
                pool.submit(r.client.weight_route, "/update_weights", {"update_info": update_info})
                for r in receivers
            ]
            try:
                stream = iter(named_params)
                for bucket in plan:
                    tensors = [self._checked(next(stream, None), metadata[i]) for i in bucket]
                    buffer = pack(tensors)
                    self.group.broadcast(buffer)
                    sent += buffer.numel()
            except BaseException:
                # Leaving the group ends the receivers' wait at once (their broadcast fails), instead of at
                # the group's timeout.
                self.close_communicator()
                raise
            finally:
                # Every receiver's answer, even after a failed broadcast: a lost member makes the others'
                # receive fail too, and each answer says which.
                errors = [load.exception() for load in loads]
        for error in errors:
            if error is not None:
                raise error
        self._on_each(receivers, lambda r: r.client.weight_route("/finish_weight_update"))
        self.last_sync_bytes_sent = sent

    def _checked(self, pair: tuple[str, Any] | None, announced: tuple[str, str, list[int]]) -> Any:
        """The tensor on the group's device, after checking it is the announced one: a receiver sizes its
        buffer from the announcement, and gloo aborts a process whose receive does not match what is sent,
        so a mismatch must stop here, not kill vLLM."""
        expected, dtype, shape = announced
        if pair is None:
            raise WeightSyncError(f"the weights ended before {expected}, which the metadata announced")
        name, tensor = pair
        sent_dtype = str(tensor.dtype).removeprefix("torch.")
        if name != expected or list(tensor.shape) != list(shape) or sent_dtype != dtype:
            raise WeightSyncError(
                f"the weights changed between the metadata and the broadcast: {name} {list(tensor.shape)} "
                f"({sent_dtype}) arrived where {expected} {shape} ({dtype}) was announced"
            )
        return tensor.detach().to(self.device)

    @staticmethod
    def _start(replica: Replica) -> None:
        """Opens an update on the replica; one left open by an earlier trainer (killed mid-update beside a
        server that was kept) is closed first."""
        try:
            replica.client.weight_route("/start_weight_update")
        except WeightSyncError as exc:
            if "already active" not in str(exc):
                raise
            log.warning(
                "vLLM replica %d at %s held an update left open by an earlier sync; it is closed and the "
                "whole model sent again",
                replica.index,
                replica.base_url,
            )
            BroadcastReplicaPool._finish_quietly(replica)
            replica.client.weight_route("/start_weight_update")

    @staticmethod
    def _finish_quietly(replica: Replica) -> None:
        try:
            replica.client.weight_route("/finish_weight_update")
        except WeightSyncError as exc:
            log.info("vLLM replica %d had no update to close (%s)", replica.index, str(exc)[:200])

    @staticmethod
    def _on_each(receivers: list[Replica], call: Callable[[Replica], None]) -> None:
        """``call`` on every receiver at once; the first error is raised once all have answered."""
        with ThreadPoolExecutor(max_workers=len(receivers)) as pool:
            for future in [pool.submit(call, r) for r in receivers]:
                future.result()
