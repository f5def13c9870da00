"""How much GPU memory one trainer process needs, planned before anything is loaded (issue 43 item 7).

From the model's ``config.json`` (a Llama/Qwen2-shaped decoder: embeddings, ``num_hidden_layers`` blocks of
attention with grouped-query K/V and a gated MLP, an LM head tied to the embeddings or not) and the job's
settings, ``plan_memory`` estimates the bytes per GPU for weights, gradients, optimizer state, a reference
model and activations. The trainer compares the plan with the GPU at start (``check_job``): a job that
cannot fit exits with ExitCode.MEMORY_PLAN_EXCEEDED and a message naming settings that would fit, computed
with the same function, instead of running into CUDA out of memory minutes later. docs/trainer.md
("Memory planning") shows the plan for common model sizes (bench/memory_table.py prints it).

Pure: no torch; reading a Hub model's config.json imports huggingface_hub only when asked to.

Precision model (grpo_config.py's mixed precision):

- full fine-tuning: fp32 master weights (4 B/param), fp32 gradients (4), fp32 AdamW moments (8):
  16 B/param whatever ``model.dtype`` is (bfloat16 and float16 train under autocast).
- LoRA: the frozen base in ``model.dtype`` (2 B/param for bfloat16/float16, 4 for float32), and the
  adapters at 16 B per adapter parameter (fp32 weights, gradients and AdamW moments).
- sharding "none" (plain DDP): every rank holds all of it. "fsdp": weights, gradients and optimizer state
  are divided by the world size; optimizer CPU offload takes the optimizer state off the GPU.
- ``beta > 0`` with full fine-tuning: TRL loads a frozen reference model like the trained one (4 B/param,
  sharded like the weights under FSDP). With LoRA the reference is the base with the adapters off: free.

Activations, for ``tokens = per_device_batch_size * (max_prompt_length + max_completion_length)`` and
``a`` bytes per activation element (2 under bfloat16/float16 autocast, 4 for float32):

- one layer's full activations: ``tokens * (8*hidden + 2*kv_dim + 4*intermediate) * a`` (the layer input
  and two norms, Q/K/V, the attention output and o_proj input, the residual, the MLP's gate, up, activation
  and product); no ``seq**2`` term: SDPA/flash attention keep no score matrix.
- with gradient checkpointing (on GPUs): ``layers * tokens * hidden * a`` for the checkpointed layer inputs,
  plus one layer's full activations twice (recomputed in the backward, and their gradients).
- without it: ``layers`` times one layer's full activations.
- LM head: TRL 1.16 scores completions with a fused, tiled LM head (``add_fused_lm_head``), which never
  holds the ``(batch, seq, vocab)`` logits: a tile of ``min(batch*completion, 4096)`` tokens by
  ``min(vocab, 32768)`` vocabulary entries in fp32, and its gradient (2 * 4 B each). Without the fused head
  (``fused_lm_head=False``) the full fp32 logits of the completions and their gradient:
  ``2 * batch * completion * vocab * 4`` B, often the largest item for GRPO's long completions.

Not planned, left to the headroom (10 % of the GPU by default): the CUDA context, NCCL buffers, the
allocator's fragmentation and short-lived temporaries.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from grpo_operator.api.trainer_config import TrainerConfig

Sharding = Literal["none", "fsdp"]

GIB = 1024**3
# Bytes per parameter of the trained weights, their gradients and AdamW's two moments (fp32 each).
MASTER_WEIGHT_BYTES = 4
GRADIENT_BYTES = 4
ADAM_BYTES = 8
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
DEFAULT_HEADROOM = 0.10
# TRL's LoraConfig default rank and this project's (spec.grpo.lora.r) for the suggestions.
DEFAULT_LORA_RANK = 16
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
# TRL 1.16's fused LM head (trl/kernels/chunked_logprob.py): tokens x vocabulary entries per fp32 tile.
LM_HEAD_TOKEN_TILE = 4096
LM_HEAD_VOCAB_TILE = 32768
# The most GPUs a suggestion names.
MAX_GPUS = 1024
# config.json keys of mixture-of-experts models, whose parameters this plan does not count.
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")
# Model types with a bias on Q/K/V when config.json says nothing (Qwen2 has one, Llama does not).
_QKV_BIAS_MODEL_TYPES = ("qwen2",)


class UnplannableModel(ValueError):
    """The config.json does not describe a dense Llama/Qwen2-shaped decoder."""


@dataclass(frozen=True)
class ModelShape:
    """The figures of a decoder's config.json that decide its size."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool
    qkv_bias: bool = False

    @staticmethod
    def from_config(config: Mapping[str, Any]) -> ModelShape:
        """From config.json's dict (a multimodal model's ``text_config`` when the top level has no decoder);
        UnplannableModel when a figure is missing or the model is a mixture of experts."""
        text = config.get("text_config")
        if "hidden_size" not in config and isinstance(text, Mapping):
            config = {
                **text,
                "tie_word_embeddings": config.get("tie_word_embeddings", text.get("tie_word_embeddings")),
            }
        moe = [key for key in _MOE_KEYS if config.get(key)]
        if moe:
            raise UnplannableModel(f"a mixture-of-experts model ({', '.join(moe)}) is not planned")
        try:
            heads = int(config["num_attention_heads"])
            hidden = int(config["hidden_size"])
            shape = ModelShape(
                vocab_size=int(config["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(config["intermediate_size"]),
                num_hidden_layers=int(config["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                qkv_bias=bool(
                    config.get("attention_bias", config.get("model_type") in _QKV_BIAS_MODEL_TYPES)
                ),
            )
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
            raise UnplannableModel(f"config.json lacks a usable {exc} for a decoder's size") from None
        if min(dataclasses.astuple(shape)[:7]) <= 0:
            raise UnplannableModel("config.json has a non-positive size")
        return shape

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one block, by its module name."""
        h, i = self.hidden_size, self.intermediate_size
        return {
            "q_proj": (h, self.q_dim),
            "k_proj": (h, self.kv_dim),
            "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def parameter_count(self) -> int:
        """Embeddings, blocks (attention, MLP, two RMSNorms), final norm, LM head unless tied."""
        block = sum(fan_in * fan_out for fan_in, fan_out in self.linear_shapes().values())
        block += 2 * self.hidden_size
        if self.qkv_bias:
            block += self.q_dim + 2 * self.kv_dim
        embeddings = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embeddings
        return embeddings + self.num_hidden_layers * block + self.hidden_size + head

    def lora_parameter_count(self, rank: int, target_modules: Iterable[str]) -> int:
        """r * (in + out) per adapted linear layer; "all-linear" adapts every block's linear layers (PEFT
        leaves the LM head out). Names this shape does not know add nothing."""
        shapes = self.linear_shapes()
        targets = set(target_modules)
        names = set(shapes) if "all-linear" in targets else targets & set(shapes)
        per_block = sum(rank * (shapes[name][0] + shapes[name][1]) for name in names)
        return self.num_hidden_layers * per_block


@dataclass(frozen=True)
class JobShape:
    """The settings of a job that decide the memory of one trainer process."""

    dtype: str = "bfloat16"
    lora: bool = False
    lora_rank: int = DEFAULT_LORA_RANK
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS
    sharding: Sharding = "none"
    optimizer_offload: bool = False
    world_size: int = 1
    per_device_batch_size: int = 1
    max_prompt_length: int = 512
    max_completion_length: int = 256
    gradient_checkpointing: bool = True
    # GRPO's KL coefficient: > 0 loads a reference model (full fine-tuning only).
    beta: float = 0.0
    fused_lm_head: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"model.dtype {self.dtype!r} is not one of {sorted(DTYPE_BYTES)}")
        if self.sharding not in ("none", "fsdp"):
            raise ValueError(f"sharding {self.sharding!r} is not 'none' or 'fsdp'")
        if self.optimizer_offload and self.sharding != "fsdp":
            raise ValueError("optimizer CPU offload needs sharding 'fsdp'")
        if min(self.world_size, self.per_device_batch_size, self.lora_rank) < 1:
            raise ValueError("world size, batch size and LoRA rank must be at least 1")


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per GPU of one trainer process, by part."""

    model: ModelShape
    job: JobShape
    parameters: int
    trainable_parameters: int
    weights: int
    gradients: int
    optimizer: int
    reference: int
    activations: int
    lm_head: int

    @property
    def total(self) -> int:
        return (
            self.weights + self.gradients + self.optimizer + self.reference + self.activations + self.lm_head
        )

    def parts(self) -> dict[str, int]:
        return {
            "weights": self.weights,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "reference model": self.reference,
            "activations": self.activations,
            "LM head": self.lm_head,
        }

    def describe(self) -> str:
        """The model, the setting and the parts in GiB (the total is the caller's to say)."""
        parts = ", ".join(f"{name} {gib(size)}" for name, size in self.parts().items() if size)
        return f"{self.parameters / 1e9:.2f}B parameters, {setting(self.job)}; {parts} GiB"


def gib(size: float) -> str:
    return f"{size / GIB:.1f}"


def setting(job: JobShape) -> str:
    """The job's memory-relevant settings in the words of the spec."""
    mode = "LoRA r=" + str(job.lora_rank) if job.lora else "full fine-tuning"
    shard = f"FSDP over {job.world_size} GPUs" if job.sharding == "fsdp" else f"DDP on {job.world_size} GPUs"
    if job.world_size == 1 and job.sharding == "none":
        shard = "1 GPU"
    offload = ", optimizer offloaded to the CPU" if job.optimizer_offload else ""
    return f"{mode}, {job.dtype}, {shard}{offload}, batch {job.per_device_batch_size}"


def plan_memory(model: ModelShape, job: JobShape) -> MemoryPlan:
    """Per-GPU bytes of training ``model`` as ``job`` says (the module docstring has the formulas)."""
    params = model.parameter_count()
    shards = job.world_size if job.sharding == "fsdp" else 1
    if job.lora:
        trainable = model.lora_parameter_count(job.lora_rank, job.lora_targets)
        weights = params * DTYPE_BYTES[job.dtype] + trainable * MASTER_WEIGHT_BYTES
        reference = 0
    else:
        trainable = params
        weights = params * MASTER_WEIGHT_BYTES
        reference = params * MASTER_WEIGHT_BYTES if job.beta > 0 else 0
    gradients = trainable * GRADIENT_BYTES
    optimizer = 0 if job.optimizer_offload else trainable * ADAM_BYTES

    act = DTYPE_BYTES[job.dtype]
    tokens = job.per_device_batch_size * (job.max_prompt_length + job.max_completion_length)
    h = model.hidden_size
    one_layer = tokens * (8 * h + 2 * model.kv_dim + 4 * model.intermediate_size) * act
    if job.gradient_checkpointing:
        activations = model.num_hidden_layers * tokens * h * act + 2 * one_layer
    else:
        activations = model.num_hidden_layers * one_layer
    scored = job.per_device_batch_size * job.max_completion_length
    if job.fused_lm_head:
        lm_head = 2 * min(scored, LM_HEAD_TOKEN_TILE) * min(model.vocab_size, LM_HEAD_VOCAB_TILE) * 4
    else:
        lm_head = 2 * scored * model.vocab_size * 4
    return MemoryPlan(
        model=model,
        job=job,
        parameters=params,
        trainable_parameters=trainable,
        weights=_ceil_div(weights, shards),
        gradients=_ceil_div(gradients, shards),
        optimizer=_ceil_div(optimizer, shards),
        reference=_ceil_div(reference, shards),
        activations=activations,
        lm_head=lm_head,
    )


def _ceil_div(size: int, parts: int) -> int:
    return -(-size // parts)


def usable_bytes(gpu_bytes: int, headroom: float = DEFAULT_HEADROOM) -> int:
    return int(gpu_bytes * (1.0 - headroom))


def fits(plan: MemoryPlan, gpu_bytes: int, headroom: float = DEFAULT_HEADROOM) -> bool:
    """Whether the plan fits a GPU of ``gpu_bytes``, keeping ``headroom`` (a fraction of it) free for what
    the plan does not count."""
    if not 0.0 <= headroom < 1.0:
        raise ValueError(f"headroom {headroom} must be a fraction in [0, 1)")
    return plan.total <= usable_bytes(gpu_bytes, headroom)


def min_gpus(
    model: ModelShape, job: JobShape, gpu_bytes: int, headroom: float = DEFAULT_HEADROOM
) -> MemoryPlan | None:
    """The plan with the fewest GPUs (world size) that fits under ``job``'s other settings; None when none
    up to MAX_GPUS does. Without FSDP every GPU holds everything: one GPU fits or none does."""
    most = MAX_GPUS if job.sharding == "fsdp" else 1
    for n in range(1, most + 1):
        plan = plan_memory(model, dataclasses.replace(job, world_size=n))
        if fits(plan, gpu_bytes, headroom):
            return plan
    return None


def alternatives(
    model: ModelShape, job: JobShape, gpu_bytes: int, headroom: float = DEFAULT_HEADROOM
) -> list[tuple[str, MemoryPlan]]:
    """Settings that would fit, each with its plan, in the order the message names them: FSDP (it keeps
    full fine-tuning) on the job's GPUs or the fewest that fit, FSDP with optimizer offload when that
    needs fewer GPUs, LoRA, a batch of one. Every figure comes from plan_memory."""
    found: list[tuple[str, MemoryPlan]] = []

    def fewest(shape: JobShape) -> MemoryPlan | None:
        # The job's own GPU count when it suffices (a suggestion does not take GPUs away), else the fewest.
        least = min_gpus(model, shape, gpu_bytes, headroom)
        if least is None or least.job.world_size >= job.world_size:
            return least
        return plan_memory(model, dataclasses.replace(shape, world_size=job.world_size))

    def offer(words: str, plan: MemoryPlan) -> None:
        if plan.job != job and all(plan.job != seen.job for _, seen in found):
            found.append((words, plan))

    fsdp = dataclasses.replace(job, sharding="fsdp", optimizer_offload=False)
    sharded = fewest(fsdp)
    if sharded is not None:
        offer(f"spec.trainer.sharding FSDP over {_gpus(sharded)}", sharded)
    offloaded = fewest(dataclasses.replace(fsdp, optimizer_offload=True))
    if offloaded is not None and (sharded is None or offloaded.job.world_size < sharded.job.world_size):
        host = plan_memory(model, dataclasses.replace(offloaded.job, optimizer_offload=False)).optimizer
        offer(
            f"spec.trainer.sharding FSDP and cpuOffload: true over {_gpus(offloaded)} ({gib(host)} GiB of host "
            "memory per GPU for the optimizer state alone)",
            offloaded,
        )
    if not job.lora:
        # LoRA runs as DDP only (the API refuses LoRA with FSDP): offered where its frozen base fits one GPU.
        lora = dataclasses.replace(job, lora=True, sharding="none", optimizer_offload=False)
        alone = plan_memory(model, lora)
        if fits(alone, gpu_bytes, headroom):
            offer(f"LoRA (spec.grpo.lora.enabled: true, r={job.lora_rank}, sharding DDP)", alone)
    if job.per_device_batch_size > 1:
        small = plan_memory(model, dataclasses.replace(job, per_device_batch_size=1))
        if fits(small, gpu_bytes, headroom):
            offer("spec.trainer.perDeviceBatchSize 1", small)
    return found


def _gpus(plan: MemoryPlan) -> str:
    n = plan.job.world_size
    return f"{n} GPU{'s' if n > 1 else ''}"


def message(plan: MemoryPlan, gpu_bytes: int, headroom: float = DEFAULT_HEADROOM) -> str:
    """What the plan needs against the GPU; when it does not fit, the settings that would, each with its
    need per GPU."""
    need = (
        f"the training needs about {gib(plan.total)} GiB per GPU ({plan.describe()}); the GPU has "
        f"{gib(gpu_bytes)} GiB, {gib(usable_bytes(gpu_bytes, headroom))} GiB of it usable with "
        f"{headroom:.0%} headroom"
    )
    if fits(plan, gpu_bytes, headroom):
        return need + ": it fits"
    options = alternatives(plan.model, plan.job, gpu_bytes, headroom)
    if not options:
        return (
            f"{need}. No setting fits this GPU up to {MAX_GPUS} GPUs (FSDP, optimizer offload, LoRA, batch 1): "
            "use GPUs with more memory or a smaller model"
        )
    tries = "; ".join(f"with {words} it needs {gib(alt.total)} GiB per GPU" for words, alt in options)
    return f"{need}. It would fit: {tries}"


def job_shape(config: TrainerConfig, world_size: int, gradient_checkpointing: bool) -> JobShape:
    """The JobShape of a trainer.json: trainer.sharding FSDP shards, anything else (DDP, unset) does not;
    trainer.cpuOffload is planned as the optimizer state leaving the GPU (FSDP2's offload also moves the
    parameter shards and gradients, so the plan errs on the side of needing more)."""
    fsdp = config.trainer.sharded
    offload = fsdp and bool(config.trainer.cpu_offload)
    lora = config.grpo.lora
    return JobShape(
        dtype=config.model.dtype,
        lora=lora.enabled,
        lora_rank=lora.r,
        lora_targets=tuple(lora.target_modules),
        sharding="fsdp" if fsdp else "none",
        optimizer_offload=offload,
        world_size=world_size,
        per_device_batch_size=config.trainer.per_device_batch_size,
        max_prompt_length=config.grpo.max_prompt_length,
        max_completion_length=config.grpo.max_completion_length,
        gradient_checkpointing=gradient_checkpointing,
        beta=config.grpo.beta,
    )


def read_model_config(name: str, revision: str | None) -> dict[str, Any]:
    """config.json of a model in a local directory, or from the Hub (its cache first; HF_TOKEN applies)."""
    local = Path(name) / "config.json"
    if Path(name).is_dir():
        path = local
    else:
        from huggingface_hub import hf_hub_download

        path = Path(hf_hub_download(name, "config.json", revision=revision))
    loaded = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(loaded, dict):
        raise UnplannableModel(f"{path} is not a JSON object")
    return loaded


def check_job(
    config: TrainerConfig,
    world_size: int,
    gpu_bytes: int | None,
    *,
    read_config: Callable[[str, str | None], Mapping[str, Any]] | None = None,
    log: logging.Logger | None = None,
) -> MemoryPlan | None:
    """The start-up check: plan the job and, on a GPU of ``gpu_bytes`` (None: the CPU), raise
    MemoryPlanExceeded when it does not fit. Without a plan (config.json unreadable, a model of another
    shape) the check logs why and lets the job run: the plan must never stop a job it cannot judge. The
    colocated vLLM engine's share of the GPU (generation.colocateMemoryShare, 0.3 unset) is not
    the trainer's."""
    from grpo_operator.api.workloads import DEFAULT_COLOCATE_MEMORY_SHARE

    from grpo_trainer.errors import MemoryPlanExceeded

    revision = None if Path(config.model.name).is_dir() else config.model.revision
    try:
        model = ModelShape.from_config((read_config or read_model_config)(config.model.name, revision))
    except Exception as exc:
        if log is not None:
            log.warning("memory plan skipped for %s: %s", config.model.name, exc)
        return None
    plan = plan_memory(model, job_shape(config, world_size, gradient_checkpointing=gpu_bytes is not None))
    if gpu_bytes is None:
        if log is not None:
            log.info(
                "memory plan, not checked on the CPU: %s GiB per GPU (%s)", gib(plan.total), plan.describe()
            )
        return plan
    text = ""
    if config.generation.backend == "vllm-colocate":
        share = config.generation.colocate_memory_share or DEFAULT_COLOCATE_MEMORY_SHARE
        gpu_bytes = int(gpu_bytes * (1.0 - share))
        text = f"the colocated vLLM engine takes {share:.0%} of the GPU, the rest is the trainer's: "
    text += message(plan, gpu_bytes)
    if not fits(plan, gpu_bytes):
        raise MemoryPlanExceeded(text + ". The job is not started: a restart would need the same memory")
    if log is not None:
        log.info("memory plan: %s", text)
    return plan
