"""Generation by a vLLM engine inside every training process (generation.backend vllm-colocate, TRL's
``vllm_mode="colocate"``), and the check that the engine serves the weights being trained.

TRL builds the engine (``vllm.LLM`` with the external launcher, one per process, seeded by the rank) and
samples each process's own prompts with it. Its weight sync writes each parameter into the engine model's
``load_weights``, which vLLM's CPU build refuses after the first load (the layers it repacked for its kernels
have no ``weight_loader``: "'Parameter' object has no attribute 'weight_loader'"). :func:`generation_class`
loads them through the model runner's ``reload_weights`` in checkpoint format instead, vLLM's own path for
new weights into a running engine (the one the volume transport of server mode takes, weight_sync.py), which
restores the kernel layout after loading, on GPU and CPU builds alike.

After every sync, :class:`EngineProbe` compares the engine's log-probabilities of the probe text with the
training model's (weight_sync.ServedModelProbe's comparison, without HTTP), and rank 0 reports both through
the same SyncReporter as server mode: a line in weight_syncs.jsonl with transport ``colocate``.
"""

from __future__ import annotations

import functools
import importlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from grpo_trainer.trl_adapter import VLLM_COLOCATE_RUNNER_PATH, VLLM_ENGINE_MODULE, VLLM_ENGINE_NAME
from grpo_trainer.weight_sync import ProbeResult, ServedModelProbe, SyncReport, served_tensors

log = logging.getLogger("grpo_trainer.colocate")

# weight_syncs.jsonl's transport (and status.servedModel's weightSync) for the in-memory sync.
TRANSPORT = "colocate"


def model_runner(llm: Any) -> Any:
    """vLLM's model runner of a colocated engine (the path TRL's own colocate sync takes to it)."""
    runner = llm
    for attribute in VLLM_COLOCATE_RUNNER_PATH:
        runner = getattr(runner, attribute)
    return runner


def engine_logprobs(llm: Any, token_ids: list[int]) -> list[float]:
    """The engine's log-probability of each of ``token_ids`` after the first (the ``prompt_logprobs`` of a
    one-token request; temperature 1, so that the processed log-probabilities TRL's engine returns are the
    model's own)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
    output = llm.generate([{"prompt_token_ids": token_ids}], sampling_params=params, use_tqdm=False)[0]
    entries = (output.prompt_logprobs or [])[1:]
    out: list[float] = []
    for token, entry in zip(token_ids[1:], entries, strict=True):
        chosen = entry.get(token) if entry else None
        out.append(float(chosen.logprob) if chosen is not None else float("-inf"))
    return out


class EngineProbe:
    """weight_sync.ServedModelProbe against the process's own engine."""

    def __init__(self, tokenizer: Any, every_syncs: int = 1) -> None:
        self.probe = ServedModelProbe(tokenizer, every_syncs)

    def due(self) -> bool:
        return self.probe.due()

    def check(self, model: Any, llm: Any) -> ProbeResult:
        trained = self.probe.trained_logprobs(model)
        return self.probe.compare(trained, engine_logprobs(llm, self.probe.token_ids))


def worst(results: list[ProbeResult]) -> ProbeResult:
    """The result of the engine furthest from its trainer (NaN counts as furthest)."""
    return max(results, key=lambda r: r.mean_abs_diff if math.isfinite(r.mean_abs_diff) else math.inf)


def checkpoint_weights(named_params: Iterator[tuple[str, Any]], copy: bool) -> Iterator[tuple[str, Any]]:
    """TRL's (name, tensor) pairs in the form vLLM loads; ``copy`` for a LoRA model, whose merged weights TRL
    unmerges in place once its iteration ends, possibly before vLLM's layer-wise reload has read them all."""
    for name, tensor in named_params:
        yield name, tensor.detach().clone() if copy else tensor.detach()


@contextmanager
def engine_dtype(dtype: str | None) -> Iterator[None]:
    """While TRL builds its engine inside this block, the engine serves ``dtype`` (None: vLLM's "auto", which
    serves a float32 checkpoint in 16 bits). TRL's _init_vllm passes no dtype to ``vllm.LLM``, which it calls
    by its module's name (trl_adapter.VLLM_ENGINE_MODULE / VLLM_ENGINE_NAME)."""
    if dtype is None:
        yield
        return
    module = importlib.import_module(VLLM_ENGINE_MODULE)
    engine = getattr(module, VLLM_ENGINE_NAME)
    setattr(module, VLLM_ENGINE_NAME, functools.partial(engine, dtype=dtype))
    try:
        yield
    finally:
        setattr(module, VLLM_ENGINE_NAME, engine)


def generation_class(probe: EngineProbe | None, dtype: str | None = None) -> type[Any]:
    """TRL's VLLMGeneration (colocate mode) whose engine serves ``dtype`` (trainer.json model.dtype, as a
    vLLM server is started with ``--dtype``), and whose weight sync goes through vLLM's ``reload_weights``
    and is then probed and reported. Its ``on_sync`` (set on the instance by the trainer) receives a
    SyncReport on rank 0 after every sync. Collective: TRL calls sync_weights on every rank, and the probe
    results are gathered to rank 0, which reports the engine furthest from its trainer."""
    from accelerate.utils import gather_object, is_peft_model
    from trl.generation.vllm_generation import VLLMGeneration

    class ColocatedVLLMGeneration(VLLMGeneration):  # type: ignore[misc, valid-type]
        on_sync: Callable[[SyncReport], None] | None = None
        syncs = 0

        def _init_vllm(self) -> None:
            if self.mode != "colocate":
                raise ValueError(
                    f"generation.backend vllm-colocate builds TRL's vLLM helper in colocate mode, not {self.mode!r}"
                )
            started = time.monotonic()
            with engine_dtype(dtype):
                super()._init_vllm()  # type: ignore[no-untyped-call]
            model_config = self.llm.llm_engine.model_config
            log.info(
                "colocated vLLM engine started in %.1fs (dtype %s, max_model_len %s, memory share %s)",
                time.monotonic() - started,
                str(model_config.dtype).removeprefix("torch."),
                model_config.max_model_len,
                self.gpu_memory_utilization,
            )

        def _iter_named_params(self) -> Iterator[tuple[str, Any]]:
            return served_tensors(super()._iter_named_params(), dtype)  # type: ignore[no-untyped-call]

        def sync_weights(self) -> None:
            started = time.monotonic()
            if self.enable_sleep_mode:
                # TRL wakes the engine's weights first; the trainer never turns sleep mode on.
                raise ValueError("the colocated engine's weight sync does not support vLLM sleep mode")
            named = self._iter_named_params()
            weights = checkpoint_weights(named, copy=is_peft_model(self.model))
            model_runner(self.llm).reload_weights(weights_iterator=weights, is_checkpoint_format=True)
            # A prefix-cache entry computed with the old weights must not be reused.
            self.llm.reset_prefix_cache()
            seconds = time.monotonic() - started
            self.syncs += 1
            result: ProbeResult | None = None
            if probe is not None and probe.due():
                local = probe.check(self.model, self.llm)
                results = gather_object([local]) if self.accelerator.num_processes > 1 else [local]
                result = worst(list(results))
            if self.accelerator.is_main_process and self.on_sync is not None:
                self.on_sync(SyncReport(seconds, result))

    return ColocatedVLLMGeneration
