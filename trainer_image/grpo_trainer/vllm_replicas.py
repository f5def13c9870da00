"""Several vLLM servers behind the one client TRL's VLLMGeneration talks to (spec.generation.replicas).

:class:`ReplicaPool` answers the calls TRL makes on its ``VLLMClient`` (``generate``, ``update_named_params``,
``reset_prefix_cache``, ``init_communicator``, ``close_communicator``) over one client per replica:

* A generation splits the step's distinct prompts into one contiguous part per serving replica, the least
  loaded first, and sends the parts at once. Each prompt goes to one server with ``n`` = G, so a group's G
  samples come from one server and its prompt is cached once; the answers are joined in the prompts' order.
* Only replicas that serve the trained weights are sent work. A replica whose request fails because the
  server is gone (refused or broken connection, timeout, 5xx past the retries) leaves the pool; its part is
  sent again to the others. When no replica is left the error is raised to the caller, which waits for a
  replacement as with a single server.
* A weight update writes the weights once to the shared volume and has every serving replica reload them,
  together with every replica that had left and answers ``/health`` again (the operator's replacement):
  that is how a new replica receives the current weights before it serves anything. A LoRA job's adapter
  (``update_adapter``) goes the same way, each replica loading it under the same name.

Replica 0's client owns the sync directory (its versions and their pruning); the other clients only
reload. Weight sync over NCCL to several servers is refused at apply time, so every client here is a
volume client.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from grpo_trainer.vllm_wait import lost_server

T = TypeVar("T")

log = logging.getLogger("grpo_trainer.vllm_replicas")


@dataclass
class Replica:
    """One vLLM server of the job and what the pool knows of it."""

    index: int
    client: Any
    # Serves the weights of the newest update: the only state in which it is sent work.
    serving: bool = True
    in_flight: int = 0
    requests: int = 0
    prompts: int = 0

    @property
    def base_url(self) -> str:
        return str(self.client.base_url)


class NoReplicaServing(ConnectionError):
    """Every replica is gone: to the caller, a lost server (it waits for a replacement, as with one)."""


class ReplicaPool:
    """One client over the job's vLLM replicas (see the module's docstring)."""

    def __init__(self, clients: list[Any], healthy: Callable[[str], bool]) -> None:
        if not clients:
            raise ValueError("a replica pool needs at least one vLLM client")
        self.replicas = [Replica(index, client) for index, client in enumerate(clients)]
        self._healthy = healthy
        self._lock = threading.Lock()
        # Replicas that received the weights again at the newest update, after they had left the pool.
        self.rejoined: list[int] = []
        # The served-model probe's mean |served - trained| log-probability per replica, at the newest sync.
        self.probe_diffs: dict[int, float] = {}

    # --- what TRL and the project read off a client ---------------------------------------------------

    @property
    def base_url(self) -> str:
        return self.replicas[0].base_url

    def get_server_info(self) -> dict[str, Any]:
        """Replica 0's: every replica runs the pod the operator renders from one spec."""
        info: dict[str, Any] = self._first_serving().client.get_server_info()
        return info

    def image_features(self, images: list[Any]) -> list[Any]:
        features: list[Any] = self._first_serving().client.image_features(images)
        return features

    def serving(self) -> list[Replica]:
        with self._lock:
            return [r for r in self.replicas if r.serving]

    def describe(self) -> str:
        return ", ".join(
            f"replica {r.index} ({r.base_url}): {'serving' if r.serving else 'left the pool'}, "
            f"{r.requests} requests, {r.prompts} prompts"
            for r in self.replicas
        )

    def report(self) -> dict[str, Any]:
        """Each replica's state after a sync, for output/weight_syncs.jsonl (index order)."""
        with self._lock:
            return {
                "serving": [r.index for r in self.replicas if r.serving],
                "rejoined": list(self.rejoined),
                "requests": [r.requests for r in self.replicas],
                "prompts": [r.prompts for r in self.replicas],
                "logprob_diff": {str(i): d for i, d in sorted(self.probe_diffs.items())},
            }

    def leave(self, replica: Replica, exc: BaseException) -> None:
        with self._lock:
            was = replica.serving
            replica.serving = False
        if was:
            log.warning(
                "vLLM replica %d at %s stopped answering (%s: %s); the other replicas take its work until it "
                "answers again and has the current weights",
                replica.index,
                replica.base_url,
                type(exc).__name__,
                str(exc)[:300],
            )

    # --- generation -----------------------------------------------------------------------------------

    def generate(
        self, prompts: list[Any], features: list[Any] | None = None, **params: Any
    ) -> dict[str, Any]:
        """TRL's ``VLLMClient.generate`` over the serving replicas; the same keys, in the prompts' order."""
        if not prompts:
            empty: dict[str, Any] = self._first_serving().client.generate(
                prompts=prompts, features=features, **params
            )
            return empty
        pending = self._split(len(prompts), len(self.serving()))
        outputs: dict[int, dict[str, Any]] = {}
        last_loss: BaseException | None = None
        while pending:
            serving = sorted(self.serving(), key=lambda r: (r.in_flight, r.prompts, r.index))
            if not serving:
                raise NoReplicaServing(f"no vLLM replica answers: {self.describe()}") from last_loss
            work = [(part, serving[i % len(serving)]) for i, part in enumerate(pending)]
            pending = []
            with ThreadPoolExecutor(max_workers=len(work)) as pool:
                futures = [
                    (part, replica, pool.submit(self._generate_on, replica, prompts, part, features, params))
                    for part, replica in work
                ]
                for part, replica, future in futures:
                    try:
                        outputs[part[0]] = future.result()
                    except Exception as exc:
                        if not lost_server(exc):
                            raise
                        self.leave(replica, exc)
                        last_loss = exc
                        pending.append(part)
        return self._join([outputs[start] for start in sorted(outputs)])

    def _generate_on(
        self,
        replica: Replica,
        prompts: list[Any],
        part: tuple[int, int],
        features: list[Any] | None,
        params: dict[str, Any],
    ) -> dict[str, Any]:
        start, end = part
        with self._lock:
            replica.in_flight += 1
        try:
            out: dict[str, Any] = replica.client.generate(
                prompts=prompts[start:end],
                features=None if features is None else features[start:end],
                **params,
            )
        finally:
            with self._lock:
                replica.in_flight -= 1
        with self._lock:
            replica.requests += 1
            replica.prompts += end - start
        return out

    @staticmethod
    def _split(count: int, parts: int) -> list[tuple[int, int]]:
        """``count`` prompts as ``parts`` contiguous ranges differing in length by at most one."""
        parts = max(1, min(parts, count))
        base, extra = divmod(count, parts)
        out: list[tuple[int, int]] = []
        start = 0
        for i in range(parts):
            end = start + base + (1 if i < extra else 0)
            out.append((start, end))
            start = end
        return out

    @staticmethod
    def _join(outputs: list[dict[str, Any]]) -> dict[str, Any]:
        joined: dict[str, Any] = {}
        for key in outputs[0]:
            values: list[Any] = [out.get(key) for out in outputs]
            joined[key] = None if any(v is None for v in values) else [x for v in values for x in v]
        return joined

    def _first_serving(self) -> Replica:
        serving = self.serving()
        if not serving:
            raise NoReplicaServing(f"no vLLM replica answers: {self.describe()}")
        return serving[0]

    # --- weights --------------------------------------------------------------------------------------

    def init_communicator(self, device: Any = 0) -> None:
        for replica in self.replicas:
            replica.client.init_communicator()

    def close_communicator(self) -> None:
        for replica in self.replicas:
            replica.client.close_communicator()

    def update_named_params(
        self, metadata: list[tuple[str, str, list[int]]], named_params: Iterator[tuple[str, Any]]
    ) -> None:
        """The weights written once, then reloaded by every serving replica and by every replica that had
        left and answers again. A replica that is lost meanwhile leaves the pool; NoReplicaServing when
        none took them."""
        started = time.monotonic()
        self._distribute(self.replicas[0].client.write_version(named_params), started)

    def update_adapter(self, model: Any) -> None:
        """A LoRA job's adapter written once, then loaded and served by every replica that would reload
        weights (update_named_params), under the same name."""
        started = time.monotonic()
        self._distribute(self.replicas[0].client.write_adapter(model), started)

    @property
    def last_sync_bytes(self) -> int:
        return int(self.replicas[0].client.last_sync_bytes)

    def use_base_model(self) -> None:
        for replica in self.replicas:
            replica.client.use_base_model()

    def _distribute(self, version: Path, started: float) -> None:
        writer = self.replicas[0].client
        self.rejoined = self._reload(self._receivers(), version)
        writer.prune(version)
        log.info(
            "weights synced through %s to %d of %d vLLM replicas in %.2fs",
            version,
            len(self.serving()),
            len(self.replicas),
            time.monotonic() - started,
        )

    def _receivers(self) -> list[Replica]:
        """The serving replicas, and those that left and answer /health now. A replica being replaced
        refuses connections (its Service has no ready endpoint), so asking costs little."""
        return [r for r in self.replicas if r.serving or self._healthy(r.base_url)]

    def _reload(self, receivers: list[Replica], version: Path) -> list[int]:
        """Each receiver reloads ``version`` (at once); returns the indices that rejoined."""
        if not receivers:
            raise NoReplicaServing(f"no vLLM replica answers to receive the weights: {self.describe()}")
        errors: dict[int, BaseException] = {}
        with ThreadPoolExecutor(max_workers=len(receivers)) as pool:
            futures = [(r, pool.submit(r.client.reload, version)) for r in receivers]
            for replica, future in futures:
                try:
                    future.result()
                except Exception as exc:
                    errors[replica.index] = exc
        rejoined: list[int] = []
        for replica in receivers:
            error = errors.get(replica.index)
            if error is None:
                with self._lock:
                    if not replica.serving:
                        rejoined.append(replica.index)
                    replica.serving = True
                continue
            if not lost_server(error):
                raise error
            self.leave(replica, error)
        for index in rejoined:
            log.warning(
                "vLLM replica %d at %s answers again and reloaded the current weights (%s): it serves again",
                index,
                self.replicas[index].base_url,
                version,
            )
        if not self.serving():
            raise NoReplicaServing(f"no vLLM replica took the weights: {self.describe()}") from next(
                iter(errors.values())
            )
        return rejoined

    def any_answering(self) -> bool:
        return any(self._healthy(r.base_url) for r in self.replicas)

    def reset_prefix_cache(self) -> None:
        self.each_serving(lambda client: client.reset_prefix_cache())

    def each_serving(self, call: Callable[[Any], T]) -> dict[int, T]:
        """``call(client)`` on every serving replica, by replica index. A replica that is lost meanwhile
        leaves the pool; NoReplicaServing when none answered."""
        out: dict[int, T] = {}
        for replica in self.serving():
            try:
                out[replica.index] = call(replica.client)
            except Exception as exc:
                if not lost_server(exc):
                    raise
                self.leave(replica, exc)
        if not out:
            raise NoReplicaServing(f"no vLLM replica answers: {self.describe()}")
        return out
