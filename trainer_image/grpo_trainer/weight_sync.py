"""Weight sync with the job's vLLM server, and the check that vLLM serves the model the trainer trains.

Two transports carry the weights after every optimizer step (spec.generation.weightSync):

* ``nccl`` (the default): TRL's own ``VLLMClient`` broadcasts the tensors over an NCCL group that
  trainer rank 0 forms with the vLLM workers. Needs CUDA on both sides and a pod-to-pod path.
* ``volume``: :class:`VolumeSyncClient` writes the weights as safetensors shards into a fresh directory on
  the volume both pods mount, then asks vLLM to reload them (``POST /collective_rpc`` with the worker
  method ``reload_weights``, served in vLLM's dev mode, which the operator turns on). No CUDA, no port
  between the pods, no vLLM package in the trainer image; it costs a write and a read of the full weights
  per step. Stock vLLM images serve it: nothing needs to be installed on the vLLM side.

A LoRA job syncing through the volume sends only its adapter (``update_adapter``): PEFT's adapter files
under a new name each sync (``lora-000001``, ...), which vLLM loads through ``POST /v1/load_lora_adapter``
(the operator starts it with ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``) and every later
request names; vLLM keeps the base model it started with, which is never sent. The served-model probe then
compares the served adapter with the trained one.

Either way :class:`ServedModelProbe` compares, after a sync, the served model's log-probabilities of a fixed
probe text with the trainer's own model: a sync that silently misses a tensor (the tied output layer of
many small models, see docs/trainer.md) would otherwise train one model and sample from another.
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("grpo_trainer.weight_sync")

# Largest safetensors shard written at once: the trainer holds at most one shard of copied weights in
# host memory, whatever the model's size.
SHARD_BYTES = 1 << 30
# Directories under the sync dir: one per sync, the newest one is what vLLM serves.
SYNC_PREFIX = "v"
INCOMING_PREFIX = ".incoming-"
# A LoRA job's adapter versions: the directory and the name vLLM serves it under.
ADAPTER_PREFIX = "lora-"
# Adapter versions kept loaded and on the volume: the newest and the one before, on which requests sent just
# before the switch (the asynchronous producer's) still run; vLLM may read an adapter's files again while
# it is loaded (a cache eviction), so its directory stays as long as the adapter does.
KEPT_ADAPTERS = 2
# The text whose log-probabilities both sides compute; lower-case ASCII so any tokenizer encodes it.
PROBE_TEXT = "the quick brown fox jumps over the lazy dog. 1 + 2 = 3"
# Mean |served - trained| log-probability per probe token above which the served model has drifted. bf16
# serving of a float32 (or bf16) trainer differs by ~0.01 on the probe; a missed tensor by 0.5 and more.
DRIFT_TOLERANCE = 0.2


class WeightSyncError(RuntimeError):
    """vLLM did not take the new weights; the message names the server, the directory and vLLM's answer."""


# True once SIGTERM arrived (set by the entry point). A request to an unreachable vLLM server backs off for
# about a minute before it fails; a trainer told to stop meanwhile (its gang is being replaced, typically
# because that very server died) stops backing off and exits at once, so the next attempt, which starts only
# once this pod is gone, is not held up.
_STOP_CHECK: list[Callable[[], bool]] = []


def stop_retrying_when(check: Callable[[], bool]) -> None:
    _STOP_CHECK[:] = [check]


def stopping() -> bool:
    return any(check() for check in _STOP_CHECK)


def _stoppable_retry_class() -> type[Any]:
    from urllib3.util.retry import Retry

    from grpo_trainer.vllm_wait import GenerationUnavailable

    class StoppableRetry(Retry):  # type: ignore[misc]
        """urllib3's Retry whose backoff ends in GenerationUnavailable once the trainer is stopping."""

        def sleep(self, response: Any = None) -> None:
            wait = (
                self.get_retry_after(response)
                if response is not None and self.respect_retry_after_header
                else None
            )
            deadline = time.monotonic() + (wait if wait is not None else self.get_backoff_time())
            while True:
                if stopping():
                    raise GenerationUnavailable(
                        "SIGTERM arrived while the vLLM server was not answering: the trainer exits without "
                        "finishing the step (the newest checkpoint is where the next attempt resumes)"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                time.sleep(min(0.25, left))

    return StoppableRetry


def vllm_session(retry_lost_connections: bool = True, raise_on_status: bool = True) -> Any:
    """A requests session with the retry policy of TRL's own VLLMClient (connection errors, 500/502/503,
    GET and POST, exponential backoff from 2 s): generation behaves the same whichever transport syncs the
    weights. Retrying a reload is safe: it reads the same directory again. Its backoff gives up at SIGTERM
    (stop_retrying_when).

    ``retry_lost_connections=False`` leaves refused and broken connections to the caller: a request
    repeated after the server died could reach its replacement, which serves the base model until the
    trainer has pushed its weights (see generation_class).

    ``raise_on_status=False`` returns the last 5xx answer once the retries are spent instead of raising:
    its body is the server's reason (an adapter vLLM refuses to load)."""
    import requests
    from requests.adapters import HTTPAdapter

    lost = 5 if retry_lost_connections else 0
    retry = _stoppable_retry_class()(
        total=5,
        connect=lost,
        read=lost,
        status=3,
        status_forcelist=[500, 502, 503],
        backoff_factor=2,
        allowed_methods=["POST", "GET"],
        raise_on_status=raise_on_status,
    )
    session = requests.Session()
    adapter = HTTPAdapter(max_retries=retry, pool_maxsize=64)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def volume_sync_client_class() -> type[Any]:
    """The client class, built on first use: TRL's VLLMClient is imported only by jobs that use vLLM."""
    from trl.generation.vllm_client import VLLMClient

    class VolumeSyncClient(VLLMClient):  # type: ignore[misc, valid-type]
        """TRL's VLLMClient for generation, with weights carried through a shared directory.

        TRL's constructor refuses to run without the vllm package, which only its NCCL transport needs,
        so this one sets up the same attributes itself; generation, server info and prefix-cache resets
        are TRL's own methods."""

        def __init__(self, base_url: str, sync_dir: str, connection_timeout: float = 0.0) -> None:
            self.session = vllm_session()
            self.base_url = base_url.rstrip("/")
            self.host = base_url
            self.group_port = 0
            self.communicator = None
            self._updating_weights = False
            self.sync_dir = Path(sync_dir)
            self.syncs = 0
            self.last_sync_seconds = 0.0
            self.last_sync_bytes = 0
            self.check_server(connection_timeout)
            self.model = self._get(f"{self.base_url}/v1/models")["data"][0]["id"]
            # The base model's name: ``model`` becomes the newest adapter's name once one is loaded.
            self.base_model = self.model
            self.adapters: list[str] = []
            # A refused adapter is answered, not raised: the first one decides whether the job falls back
            # to merged sync. A lost connection is left to the caller's recovery, as with generation.
            self.adapter_session = vllm_session(retry_lost_connections=False, raise_on_status=False)

        def init_communicator(self, device: Any = 0) -> None:
            """Empties the sync directory: what a previous attempt left there is not this run's weights."""
            self.sync_dir.mkdir(parents=True, exist_ok=True)
            for entry in self.sync_dir.iterdir():
                if entry.name.startswith((SYNC_PREFIX, INCOMING_PREFIX, ADAPTER_PREFIX)):
                    shutil.rmtree(entry, ignore_errors=True)

        def close_communicator(self) -> None:
            return None

        def update_named_params(
            self, metadata: list[tuple[str, str, list[int]]], named_params: Iterator[tuple[str, Any]]
        ) -> None:
            started = time.monotonic()
            self._serve(self.write_version(named_params), started, "weights")

        def update_adapter(self, model: Any) -> None:
            """Adapter-only sync of a LoRA job: ``model``'s adapter written and served (see the module)."""
            started = time.monotonic()
            self._serve(self.write_adapter(model), started, "LoRA adapter")

        def _serve(self, version: Path, started: float, what: str) -> None:
            self.reload(version)
            self.prune(version)
            self.last_sync_seconds = time.monotonic() - started
            log.info(
                "%s synced through %s: %.2f MB in %.2fs",
                what,
                version,
                self.last_sync_bytes / 1e6,
                self.last_sync_seconds,
            )

        def write_version(self, named_params: Iterator[tuple[str, Any]]) -> Path:
            """The weights as the sync directory's next version."""
            return self._next_version(SYNC_PREFIX, lambda incoming: write_shards(named_params, incoming))

        def write_adapter(self, model: Any) -> Path:
            """The PEFT model's adapter (PEFT's save_pretrained: the adapter's tensors and config, no base
            weight) as the sync directory's next version."""

            def save(incoming: Path) -> int:
                model.save_pretrained(str(incoming), safe_serialization=True)
                # PEFT's model card: nothing vLLM reads, so it is not sent.
                (incoming / "README.md").unlink(missing_ok=True)
                return sum(f.stat().st_size for f in incoming.rglob("*") if f.is_file())

            return self._next_version(ADAPTER_PREFIX, save)

        def _next_version(self, prefix: str, write: Callable[[Path], int]) -> Path:
            """The next version under ``prefix``: ``write`` fills a directory aside and returns the bytes it
            wrote; the directory is then renamed into place, so a server never reads a half-written one."""
            self.syncs += 1
            final = self.sync_dir / f"{prefix}{self.syncs:06d}"
            incoming = self.sync_dir / f"{INCOMING_PREFIX}{self.syncs:06d}"
            shutil.rmtree(incoming, ignore_errors=True)
            self.last_sync_bytes = write(incoming)
            shutil.rmtree(final, ignore_errors=True)
            incoming.rename(final)
            return final

        def reload(self, version: Path) -> None:
            """This client's server loads ``version`` (an adapter version: serves it, see load_adapter);
            WeightSyncError (raised from the request's error where the server was not reached) when it
            did not."""
            if version.name.startswith(ADAPTER_PREFIX):
                self.load_adapter(version)
                return
            self._post_or_raise(
                "/collective_rpc",
                {"method": "reload_weights", "kwargs": {"weights_path": str(version)}},
                f"did not reload the weights from {version}",
                "Weight sync through the volume needs vLLM in dev mode (VLLM_SERVER_DEV_MODE=1, set by the "
                "operator) and the job's volume mounted at the same path in the vLLM pod (accessMode "
                "ReadWriteMany)",
            )

        def load_adapter(self, version: Path) -> None:
            """The server loads the adapter in ``version`` under the directory's name, which every later
            request of this client names; adapters older than the KEPT_ADAPTERS newest are unloaded.
            ``load_inplace``: a server that already has that name (a previous run's, on a server kept
            across a restart) replaces it instead of refusing."""
            self._post_or_raise(
                "/v1/load_lora_adapter",
                {"lora_name": version.name, "lora_path": str(version), "load_inplace": True},
                f"did not load the LoRA adapter {version}",
                "Adapter-only LoRA sync needs vLLM started with --enable-lora and "
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (the operator renders both for LoRA jobs with "
                "weightSync Volume)",
                self.adapter_session,
            )
            self.model = version.name
            if version.name not in self.adapters:
                self.adapters.append(version.name)
            while len(self.adapters) > KEPT_ADAPTERS:
                self.unload_adapter(self.adapters.pop(0))

        def unload_adapter(self, name: str) -> None:
            """vLLM stops accepting requests for ``name`` (the ones running finish on it). A failure only
            leaves an unused name registered: logged, not raised."""
            import requests

            try:
                response = self.session.post(
                    f"{self.base_url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60
                )
                failed = response.status_code not in (200, 404)
                answer = f"HTTP {response.status_code}: {response.text[:300]}"
            except requests.RequestException as exc:
                failed, answer = True, f"{type(exc).__name__}: {exc}"
            if failed:
                log.warning(
                    "the vLLM server at %s did not unload adapter %s (%s)", self.base_url, name, answer
                )

        def use_base_model(self) -> None:
            """Requests name the base model again (the job falls back to merged sync)."""
            self.model = self.base_model

        def _post_or_raise(
            self, route: str, body: dict[str, Any], failed: str, hint: str, session: Any = None
        ) -> None:
            import requests

            lost: requests.RequestException | None = None
            try:
                response = (session or self.session).post(f"{self.base_url}{route}", json=body, timeout=600)
                answer = f"HTTP {response.status_code}: {response.text[:500]}"
            except requests.RequestException as exc:
                response, answer, lost = None, f"{type(exc).__name__}: {exc}", exc
            if response is None or response.status_code != 200:
                raise WeightSyncError(
                    f"the vLLM server at {self.base_url} {failed} ({answer}). {hint}"
                ) from lost

        def prune(self, keep: Path) -> None:
            """Drops every version but ``keep``, which a server that joins later reloads (for adapters, the
            KEPT_ADAPTERS newest, which the servers may still read)."""
            kept = {keep.name}
            if keep.name.startswith(ADAPTER_PREFIX):
                kept |= {
                    f"{ADAPTER_PREFIX}{n:06d}" for n in range(self.syncs - KEPT_ADAPTERS + 1, self.syncs)
                }
            for entry in self.sync_dir.iterdir():
                if entry.name.startswith((SYNC_PREFIX, ADAPTER_PREFIX)) and entry.name not in kept:
                    shutil.rmtree(entry, ignore_errors=True)

    return VolumeSyncClient


def served_tensors(named_params: Iterator[tuple[str, Any]], dtype: str | None) -> Iterator[tuple[str, Any]]:
    """The trainer's (name, tensor) pairs in the dtype vLLM serves (its ``--dtype``, trainer.json
    model.dtype), cast one tensor at a time on the way out. Full fine-tuning in bfloat16 or float16 holds
    fp32 master weights; sending them as they are would double the bytes every sync moves, and vLLM would
    round them to its own dtype anyway. Non-float tensors and tensors already in that dtype pass as they
    are (no copy)."""
    import torch

    target = getattr(torch, dtype) if dtype else None
    for name, tensor in named_params:
        if target is not None and tensor.is_floating_point() and tensor.dtype != target:
            yield name, tensor.to(target)
        else:
            yield name, tensor


def write_shards(
    named_params: Iterator[tuple[str, Any]], directory: Path, weight_map: dict[str, str] | None = None
) -> int:
    """Writes the tensors as safetensors shards of at most SHARD_BYTES; returns the bytes written, and fills
    ``weight_map`` (tensor name -> file name, a Hugging Face index's) when given one.

    Each tensor is copied as it arrives: TRL yields a LoRA model's merged weights and unmerges them in place
    once the iteration ends, and a tied embedding and output layer share one storage, which safetensors
    refuses to write twice. The files carry {"format": "pt"}, without which transformers refuses them."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    shard: dict[str, Any] = {}
    size = total = index = 0

    def flush() -> None:
        nonlocal shard, size, index
        if shard:
            file = f"model-{index:05d}.safetensors"
            save_file(shard, str(directory / file), metadata={"format": "pt"})
            if weight_map is not None:
                weight_map.update(dict.fromkeys(shard, file))
            index += 1
        shard, size = {}, 0

    for name, tensor in named_params:
        copy = tensor.detach().to("cpu", copy=True).contiguous()
        nbytes = copy.numel() * copy.element_size()
        if shard and size + nbytes > SHARD_BYTES:
            flush()
        shard[name] = copy
        size += nbytes
        total += nbytes
    flush()
    return total


@dataclass(frozen=True)
class ProbeResult:
    """Mean and largest |served - trained| log-probability over the probe text's tokens."""

    mean_abs_diff: float
    max_abs_diff: float
    tokens: int

    @property
    def in_sync(self) -> bool:
        return math.isfinite(self.mean_abs_diff) and self.mean_abs_diff <= DRIFT_TOLERANCE

    def describe(self) -> str:
        return (
            f"the vLLM server's log-probabilities of a fixed probe text differ from the trainer's model by "
            f"{self.mean_abs_diff:.3f} on average (largest {self.max_abs_diff:.3f}, over {self.tokens} tokens; "
            f"tolerance {DRIFT_TOLERANCE}): vLLM is not serving the weights being trained"
        )


class ServedModelProbe:
    """Compares the served model with the trainer's on PROBE_TEXT after a weight sync."""

    def __init__(self, tokenizer: Any, every_syncs: int = 1) -> None:
        ids = tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
        self.token_ids: list[int] = [int(i) for i in ids][:64]
        self.every_syncs = max(1, every_syncs)
        self.syncs = 0
        self.on_result: Callable[[ProbeResult], None] | None = None

    def due(self) -> bool:
        self.syncs += 1
        return len(self.token_ids) >= 2 and (self.syncs == 1 or self.syncs % self.every_syncs == 0)

    def trained_logprobs(self, model: Any) -> list[float]:
        """The trainer's log-probability of each probe token after the first (a forward pass; with FSDP or
        ZeRO-3 every rank must run it)."""
        import torch

        device = next(model.parameters()).device
        training = model.training
        model.eval()  # no dropout (LoRA's included): the probe compares the weights, not a noisy pass
        try:
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([self.token_ids], device=device)).logits.float()
        finally:
            model.train(training)
        logprobs = torch.log_softmax(logits[0, :-1], dim=-1)
        targets = torch.tensor(self.token_ids[1:], device=device)
        return [float(x) for x in logprobs.gather(1, targets[:, None])[:, 0].cpu()]

    def served_logprobs(self, client: Any) -> list[float]:
        """vLLM's log-probability of each probe token after the first (``prompt_logprobs`` of a completion
        request; the API returns the chosen token's entry for every prompt position but the first)."""
        response = client.session.post(
            f"{client.base_url}/v1/completions",
            json={
                "model": client.model,
                "prompt": self.token_ids,
                "max_tokens": 1,
                "temperature": 0.0,
                "prompt_logprobs": 0,
            },
            timeout=120,
        )
        if response.status_code != 200:
            raise WeightSyncError(
                f"the vLLM server at {client.base_url} refused the probe request "
                f"(HTTP {response.status_code}: {response.text[:300]})"
            )
        entries = response.json()["choices"][0]["prompt_logprobs"][1:]
        out: list[float] = []
        for token, entry in zip(self.token_ids[1:], entries, strict=True):
            chosen = entry.get(str(token)) if entry else None
            out.append(float(chosen["logprob"]) if chosen else float("-inf"))
        return out

    def compare(self, trained: list[float], served: list[float]) -> ProbeResult:
        diffs = [abs(a - b) for a, b in zip(trained, served, strict=True)]
        mean = sum(diffs) / len(diffs) if diffs else 0.0
        return ProbeResult(mean, max(diffs, default=0.0), len(diffs))


@dataclass
class SyncReport:
    """What rank 0 reports after a weight sync: its duration and, when the probe ran, its result.
    ``after_replacement``: the sync that pushed the current weights into a replaced vLLM server."""

    seconds: float
    probe: ProbeResult | None
    after_replacement: bool = False
    # With several vLLM replicas: ReplicaPool.report() after the sync (who serves, who rejoined, the load).
    replicas: dict[str, Any] | None = None
    # Bytes written for the sync (volume transport), and what they were: "adapter" (a LoRA job's adapter
    # alone) or "model" (every weight, a LoRA job's merged into them).
    bytes: int | None = None
    weights: str | None = None
