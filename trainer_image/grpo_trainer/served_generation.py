"""Server-mode generation: TRL's VLLMGeneration for the job's vLLM servers, with the job's weight transport
(weight_sync.py), the served-model probe after every sync, several replicas (vllm_replicas.py) and the
ride-out of a vLLM server the operator replaces. Colocate mode has its own (colocate.py).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from grpo_trainer.push_deadline import with_deadline
from grpo_trainer.vllm_wait import lost_server
from grpo_trainer.weight_sync import (
    ProbeResult,
    ServedModelProbe,
    SyncReport,
    WeightSyncError,
    served_tensors,
    stopping,
    vllm_session,
    volume_sync_client_class,
)

log = logging.getLogger("grpo_trainer.served_generation")

# A request that fails this many times in a row, each time with the server gone and back, is not a
# replacement to ride out: the error is raised.
MAX_RECOVERIES_PER_REQUEST = 3


def probe_served(probe: ServedModelProbe, trained: list[float], client: Any) -> ProbeResult:
    """The probe against the served model; with several replicas against each serving one, and the result
    of the one furthest from the trainer (a replica that is lost meanwhile leaves the pool)."""
    from grpo_trainer.vllm_replicas import ReplicaPool

    if not isinstance(client, ReplicaPool):
        return probe.compare(trained, probe.served_logprobs(client))
    results = client.each_serving(lambda served: probe.compare(trained, probe.served_logprobs(served)))
    client.probe_diffs = {index: result.mean_abs_diff for index, result in results.items()}
    return max(
        results.values(), key=lambda r: r.mean_abs_diff if math.isfinite(r.mean_abs_diff) else math.inf
    )


def replicas_report(client: Any) -> dict[str, Any] | None:
    report = getattr(client, "report", None)
    return report() if callable(report) else None


def sleep_unless_stopping(seconds: float) -> None:
    """wait_for_vllm's sleep: a trainer told to stop while it waits for a replaced server exits at once."""
    from grpo_trainer.vllm_wait import GenerationUnavailable

    deadline = time.monotonic() + seconds
    while True:
        if stopping():
            raise GenerationUnavailable(
                "SIGTERM arrived while the trainer waited for a replaced vLLM server: it exits without "
                "finishing the step (the newest checkpoint is where the next attempt resumes)"
            )
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(0.25, left))


def generation_class(
    weight_sync: str | None,
    sync_dir: str | None,
    probe: ServedModelProbe | None,
    replacement_budget_seconds: float = 0.0,
    server_urls: list[str] | None = None,
    served_dtype: str | None = None,
    lora: bool = False,
    broadcast_port: int = 0,
    push_timeout_seconds: float = 600.0,
) -> type[Any]:
    """TRL's VLLMGeneration (server mode) with the job's weight transport, the served-model probe, and the
    ride-out of a replaced vLLM server. Weights leave the trainer in ``served_dtype`` (served_tensors).

    Its ``on_sync`` (set on the instance by the trainer) receives a SyncReport on rank 0 after every sync.

    When a request of rank 0 to vLLM (a generation, a weight sync, the probe) fails and the server no longer
    answers /health, the operator is replacing the vLLM pod (restart policy row GenerationReplaced): rank 0
    waits up to ``replacement_budget_seconds`` (spec.generation.startupTimeoutSeconds) for the Service to
    answer again, joins the new server's weight transport, pushes the current weights into it, probes
    it, and repeats the request. The new server starts from the base model, so nothing is generated before
    that push. Only rank 0 talks to vLLM and the trainers are data-parallel (each rank holds the whole
    model), so the push needs no other rank; the others wait in the step's broadcast of the completions
    meanwhile, whose timeout is the process group's (TrainingArguments.ddp_timeout, derived from this budget
    by grpo_config.collective_timeout_seconds so that they outwait it).

    With several ``server_urls`` (spec.generation.replicas) the client is a ReplicaPool: a replica that is
    lost leaves the pool and the others serve; the wait above happens only when none is left. ``weight_sync``
    broadcast always uses a pool (weight_broadcast.BroadcastReplicaPool), one replica or several: rank 0 forms
    the group on ``broadcast_port``, and a broadcast or rendezvous gives up after ``push_timeout_seconds``. An
    NCCL push (TRL's) that overruns ``push_timeout_seconds`` ends the process (push_deadline.py).

    A ``lora`` job syncing through the volume sends only its adapter (weight_sync.py); over NCCL, or where
    the server refuses the first adapter (no LoRA support), it pushes the merged model as TRL does, and says
    why in the log."""
    from trl.generation.vllm_generation import VLLMGeneration

    from grpo_trainer.vllm_replicas import ReplicaPool
    from grpo_trainer.vllm_wait import GenerationUnavailable, vllm_healthy, wait_for_vllm

    class ProjectVLLMGeneration(VLLMGeneration):  # type: ignore[misc, valid-type]
        on_sync: Callable[[SyncReport], None] | None = None
        # Called once the weights are in place, before the probe (asynchronous jobs resume sampling then).
        on_pushed: Callable[[], None] | None = None
        replacements = 0
        # Adapter-only sync: None until the first sync tells whether the server serves adapters; False for
        # jobs that push every weight.
        adapter_sync: bool | None = None if lora and weight_sync == "volume" else False

        def _base_url(self) -> str:
            client = self.vllm_client
            return str(client.base_url)

        def _iter_named_params(self) -> Iterator[tuple[str, Any]]:
            # TRL's metadata for the NCCL transport is read from these tensors too, so it names the dtype sent.
            return served_tensors(super()._iter_named_params(), served_dtype)  # type: ignore[no-untyped-call]

        def _riding_out_replacements(
            self, request: Callable[..., Any], done_by_recovery: bool = False
        ) -> Callable[..., Any]:
            """``request`` repeated after a recovery; not repeated where the recovery did its work already (a
            weight push, a prefix-cache reset)."""

            def ride(*args: Any, **kwargs: Any) -> Any:
                for recovery in range(MAX_RECOVERIES_PER_REQUEST + 1):
                    try:
                        return request(*args, **kwargs)
                    except GenerationUnavailable:
                        raise
                    except Exception as exc:
                        if recovery == MAX_RECOVERIES_PER_REQUEST or not self._recover(exc):
                            raise
                        if done_by_recovery:
                            return None
                raise AssertionError("unreachable")

            return ride

        def _recover(self, exc: BaseException) -> bool:
            """Rank 0, after a failed request: False when the error is not a lost server (an HTTP answer
            such as 400 is the request's); else wait until the Service answers /health again and give the
            server behind it the current weights. A server that answers at once may already be the
            replacement, so the weights are pushed whichever it is: pushing them again is harmless."""
            base_url = self._base_url()
            if stopping() or replacement_budget_seconds <= 0 or not lost_server(exc):
                return False
            log.warning(
                "the vLLM server at %s stopped answering (%s: %s); waiting up to %.0fs "
                "(spec.generation.startupTimeoutSeconds) for the operator's replacement",
                base_url,
                type(exc).__name__,
                str(exc)[:300],
                replacement_budget_seconds,
            )
            client: Any = self.vllm_client
            # With several replicas, any one that answers again ends the wait (the others rejoin later).
            pool = isinstance(client, ReplicaPool)
            healthy: Callable[[str], bool] = (lambda _: client.any_answering()) if pool else vllm_healthy
            where = ", ".join(r.base_url for r in client.replicas) if pool else base_url
            if not healthy(where):
                wait_for_vllm(where, replacement_budget_seconds, healthy=healthy, sleep=sleep_unless_stopping)
            started = time.monotonic()
            client.close_communicator()  # type: ignore[no-untyped-call]
            if weight_sync == "volume":
                client.init_communicator()
            else:
                client.init_communicator(device=self.accelerator.device)
            named_params: Callable[[], Iterator[tuple[str, Any]]] = self._iter_named_params
            if self.adapter_sync is not False:
                self._push_adapter(self.accelerator.unwrap_model(self.model))
            else:
                if self._weight_metadata is None:
                    self._weight_metadata = [  # type: ignore[assignment]
                        (name, str(param.dtype).removeprefix("torch."), list(param.shape))
                        for name, param in named_params()
                    ]
                self._push(self._weight_metadata, named_params())
            self._reset_prefix_cache()
            self.replacements += 1
            result: ProbeResult | None = None
            if probe is not None:
                # The unwrapped model: a forward of the DDP wrapper on rank 0 alone would wait for the others.
                model = self.accelerator.unwrap_model(self.model)
                result = probe_served(probe, probe.trained_logprobs(model), client)
            seconds = time.monotonic() - started
            log.warning(
                "the replaced vLLM server at %s answers again; the current weights were pushed into it in %.2fs%s",
                base_url,
                seconds,
                "" if result is None else f" ({'in sync' if result.in_sync else result.describe()})",
            )
            if self.on_sync is not None:
                self.on_sync(SyncReport(seconds, result, True, replicas_report(client)))
            return True

        def _init_vllm(self) -> None:
            if (
                lora
                and self.mode == "server"
                and weight_sync != "volume"
                and self.accelerator.is_main_process
            ):
                log.info(
                    "LoRA weights are synced merged into the whole model every step: adapter-only sync "
                    "needs spec.generation.weightSync Volume (vLLM loads the adapter's files from the volume)"
                )
            if self.mode == "server" and weight_sync == "broadcast":
                self._init_broadcast()
                return
            if self.mode != "server" or weight_sync != "volume":
                super()._init_vllm()  # type: ignore[no-untyped-call]
                client = getattr(self, "vllm_client", None)
                if self.mode == "server" and client is not None:
                    # TRL's retry policy, with a backoff that gives up at SIGTERM.
                    client.session = vllm_session(retry_lost_connections=replacement_budget_seconds <= 0)
                self._wrap_client()
                return
            if not sync_dir:
                raise ValueError("weightSync volume needs generation.weightSyncDir in trainer.json")
            if self.accelerator.is_main_process:
                urls = server_urls or [
                    self.server_base_url or f"http://{self.server_host}:{self.server_port}"
                ]
                clients: list[Any] = []
                for url in urls:
                    client = volume_sync_client_class()(url, sync_dir, connection_timeout=self.server_timeout)
                    client.session = vllm_session(retry_lost_connections=replacement_budget_seconds <= 0)
                    clients.append(client)
                pool: Any = clients[0] if len(clients) == 1 else ReplicaPool(clients, vllm_healthy)
                self.vllm_client = pool
                self.vllm_client.init_communicator()
            self._wrap_client()

        def _init_broadcast(self) -> None:
            from grpo_trainer.weight_broadcast import BroadcastReplicaPool, broadcast_client_class

            if self.accelerator.is_main_process:
                urls = server_urls or [
                    self.server_base_url or f"http://{self.server_host}:{self.server_port}"
                ]
                clients = [
                    broadcast_client_class()(
                        url, connection_timeout=self.server_timeout, timeout=push_timeout_seconds
                    )
                    for url in urls
                ]
                for client in clients:
                    client.session = vllm_session(retry_lost_connections=replacement_budget_seconds <= 0)
                self.vllm_client: Any = BroadcastReplicaPool(
                    clients, vllm_healthy, broadcast_port, push_timeout_seconds, self.accelerator.device
                )
            self._wrap_client()

        def _wrap_client(self) -> None:
            client = getattr(self, "vllm_client", None)
            if self.mode != "server" or client is None or not self.accelerator.is_main_process:
                return
            # The requests TRL's VLLMGeneration makes through the client, each riding out a replaced server;
            # _push is the unwrapped update, which _recover itself uses.
            if weight_sync not in ("volume", "broadcast"):
                client.update_named_params = with_deadline(
                    client.update_named_params, push_timeout_seconds, self._base_url()
                )
            self._push = client.update_named_params
            if self.adapter_sync is not False:
                self._push_adapter = client.update_adapter
                client.update_adapter = self._riding_out_replacements(client.update_adapter, True)
            self._reset_prefix_cache = client.reset_prefix_cache
            # For the rollout producer of asynchronous jobs (async_generation.py), which must not recover.
            self.raw_generate = client.generate
            client.generate = self._riding_out_replacements(client.generate)
            client.update_named_params = self._riding_out_replacements(client.update_named_params, True)
            client.reset_prefix_cache = self._riding_out_replacements(client.reset_prefix_cache, True)

        def _sync_adapter(self) -> bool:
            """Rank 0 has every server serve the trained adapter; False when the first adapter was refused
            (a server without LoRA support): the job pushes merged weights from then on."""
            if not self.accelerator.is_main_process:
                return True
            client: Any = self.vllm_client
            try:
                client.update_adapter(self.accelerator.unwrap_model(self.model))
            except WeightSyncError as exc:
                if self.adapter_sync or lost_server(exc):
                    raise
                log.warning(
                    "adapter-only LoRA sync is off for this run, the merged model is pushed every step "
                    "instead: %s",
                    exc,
                )
                client.use_base_model()
                self.adapter_sync = False
                return False
            self.adapter_sync = True
            client.reset_prefix_cache()
            return True

        def sync_weights(self) -> None:
            started = time.monotonic()
            if self.adapter_sync is False or not self._sync_adapter():
                super().sync_weights()  # type: ignore[no-untyped-call]
            seconds = time.monotonic() - started
            if self.on_pushed is not None:
                self.on_pushed()
            result: ProbeResult | None = None
            if probe is not None and self.mode == "server" and probe.due():
                trained = probe.trained_logprobs(self.model)
                if self.accelerator.is_main_process:
                    result = self._riding_out_replacements(probe_served)(probe, trained, self.vllm_client)
            if self.accelerator.is_main_process and self.on_sync is not None:
                # A replacement during this sync has its own record (the push _recover made); this one is the
                # step's regular sync, whichever server answered it.
                client = self.vllm_client
                self.on_sync(
                    SyncReport(
                        seconds,
                        result,
                        replicas=replicas_report(client),
                        bytes=getattr(client, "last_sync_bytes", None),
                        weights="adapter" if self.adapter_sync else "model",
                    )
                )

    return ProjectVLLMGeneration
