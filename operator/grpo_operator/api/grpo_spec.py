"""``spec.grpo``: the GRPO hyper-parameters, LoRA adapters and periodic validation."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from grpo_operator.api.base import NO_SERVER_DEFAULT, ApiModel, CelRule, CelRules
from grpo_operator.api.field_types import INTEGRAL_FLOAT, K8sInt
from grpo_operator.api.grpo_presets import PRESETS, PresetName, cel_effective, describe
from grpo_operator.api.learning_health import LearningHealthSpec

# TRL 1.16's loss_type values (GRPOConfig's help and GRPOTrainer._compute_loss list the same eight).
LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]
ImportanceSamplingMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
# Defaults of the knobs a preset may set: TRL 1.16's, except where the project chose its own.
DEFAULT_LOSS_TYPE: LossType = "dapo"
DEFAULT_EPSILON = 0.2
DEFAULT_IMPORTANCE_SAMPLING_LEVEL = "token"
# Names chatTemplateKwargs must not use: the parameters of transformers' apply_chat_template and the
# variables it renders the template with, which TRL passes itself (a second value is a TypeError when the
# first prompt is rendered).
RESERVED_CHAT_TEMPLATE_KWARGS = (
    "conversation",
    "messages",
    "tools",
    "documents",
    "chat_template",
    "add_generation_prompt",
    "continue_final_message",
    "tokenize",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_dict",
    "return_assistant_tokens_mask",
    "tokenizer_kwargs",
)
_RESERVED_CEL = "[" + ", ".join(f"'{k}'" for k in RESERVED_CHAT_TEMPLATE_KWARGS) + "]"
_EFFECTIVE_EPSILON = cel_effective("epsilon", repr(DEFAULT_EPSILON))


class LoraSpec(ApiModel):
    """Low-rank adapters instead of full fine-tuning: far less GPU memory, adapters only in checkpoints."""

    enabled: bool = Field(default=False, description="Train LoRA adapters instead of all weights.")
    r: K8sInt = Field(default=16, ge=1, le=1024, description="Adapter rank.")
    alpha: K8sInt = Field(default=32, ge=1, le=4096, description="LoRA scaling numerator (lora_alpha).")
    dropout: float = Field(default=0.05, ge=0.0, lt=1.0, description="Dropout on the adapter input.")
    target_modules: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        max_length=64,
        description="Names of the modules that get adapters.",
    )


class ValidationSpec(ApiModel):
    """Periodic scoring of held-out prompts: the honest view of whether training helps."""

    every_steps: K8sInt = Field(
        default=0, ge=0, le=1_000_000, description="Validate every N steps; 0 turns validation off."
    )
    max_prompts: K8sInt = Field(
        default=64, ge=1, le=100_000, description="Validation prompts scored per run (one completion each)."
    )
    score_path: str = Field(
        default="/score",
        min_length=1,
        max_length=256,
        pattern=r"^/[A-Za-z0-9._~/-]*$",
        description=(
            "Route of the metric service that scores validation answers. /score (default) is the training "
            "reward; another route (e.g. /validate, served by the SDK's serve(metric, validation=...)) scores "
            "them with a reward the policy never trained against, which can reveal a gamed training reward."
        ),
    )


class GRPOSpec(ApiModel):
    """GRPO itself: group size G, prompts per step B, steps S, and the optimisation knobs."""

    class Rules(CelRules):
        format_failure_below_failure = CelRule(
            "self.formatFailureScore < self.failureScore",
            "spec.grpo.formatFailureScore must be strictly below spec.grpo.failureScore "
            "(unparseable output must score worse than a wrong answer): lower formatFailureScore",
            ".formatFailureScore",
        )

        # On the values training uses: the spec's, else the preset's, else the defaults (unset epsilonHigh
        # means epsilon).
        epsilon_high_at_least_epsilon = CelRule(
            f"{cel_effective('epsilon_high', _EFFECTIVE_EPSILON)} >= {_EFFECTIVE_EPSILON}",
            "spec.grpo.epsilonHigh must be >= spec.grpo.epsilon (it is the upper clip bound; where one of them "
            "is unset, spec.grpo.preset's value counts): raise epsilonHigh, or lower epsilon",
            ".epsilonHigh",
        )

        luspo_needs_sequence_level = CelRule(
            f"{cel_effective('loss_type', repr(DEFAULT_LOSS_TYPE))} != 'luspo' || "
            f"{cel_effective('importance_sampling_level', repr(DEFAULT_IMPORTANCE_SAMPLING_LEVEL))} == 'sequence'",
            "spec.grpo.lossType luspo scales each sequence's loss by its length and is defined on sequence-level "
            "importance ratios: set spec.grpo.importanceSamplingLevel: sequence, or choose another lossType",
            ".importanceSamplingLevel",
        )

        async_not_with_several_iterations = CelRule(
            f"!has(self.maxStaleness) || self.maxStaleness == 0 || {cel_effective('num_iterations', '1')} == 1",
            "spec.grpo.maxStaleness > 0 overlaps sampling the next steps with training, and numIterations > 1 "
            "trains several steps on one batch already (each reuse is off-policy by one more step): use one of "
            "the two, remove numIterations or maxStaleness",
            ".maxStaleness",
        )

        async_not_with_dynamic_sampling = CelRule(
            f"!has(self.maxStaleness) || self.maxStaleness == 0 || !{cel_effective('dynamic_sampling', 'false')}",
            "spec.grpo.maxStaleness > 0 is not supported with dynamicSampling (set by the spec or its preset): "
            "refilling tied groups samples in the middle of a step, outside the bound on staleness. Set "
            "dynamicSampling: false, or remove maxStaleness",
            ".maxStaleness",
        )

        async_keeps_the_correction = CelRule(
            "!has(self.maxStaleness) || self.maxStaleness == 0 || !has(self.vllmImportanceSamplingCorrection) || "
            "self.vllmImportanceSamplingCorrection",
            "spec.grpo.maxStaleness > 0 trains on groups sampled by older weights, and the vLLM importance-"
            "sampling correction is what reweights them to the weights being trained: remove "
            "vllmImportanceSamplingCorrection: false, or maxStaleness",
            ".vllmImportanceSamplingCorrection",
        )

        chat_template_kwargs_not_reserved = CelRule(
            f"!has(self.chatTemplateKwargs) || {_RESERVED_CEL}.all(k, !(k in self.chatTemplateKwargs))",
            "spec.grpo.chatTemplateKwargs must not name an argument the trainer passes to the chat template "
            f"itself ({', '.join(RESERVED_CHAT_TEMPLATE_KWARGS)}): remove that key",
            ".chatTemplateKwargs",
        )

    group_size: K8sInt = Field(
        ge=2,
        le=256,
        description="G: completions sampled per prompt; advantages compare them, so G >= 2 (8 is typical).",
    )
    prompts_per_step: K8sInt = Field(ge=1, le=4096, description="B: prompts per optimisation step.")
    steps: K8sInt = Field(
        ge=1,
        le=1_000_000,
        description="S: optimisation steps; the run costs S*B*G rollouts (ceil(S/numIterations)*B*G with "
        "numIterations).",
    )
    preset: PresetName | None = Field(
        default=None,
        description="A vetted group of the knobs below from the paper that introduced it; a knob the spec sets "
        "wins over the preset. dapo: lossType dapo, epsilonHigh 0.28, maskTruncatedCompletions true, "
        "dynamicSampling true (not for client rollouts). dr-grpo: lossType dr_grpo, scaleRewards none. gspo: "
        "importanceSamplingLevel sequence, lossType grpo, epsilon 3e-4, epsilonHigh 4e-4 (its clip only acts "
        "off-policy: use it with numIterations >= 2). Unset: no preset. The values used are in the job's "
        "Created event and its trainer.json (docs/concepts.md, Presets).",
    )
    learning_rate: float = Field(default=1e-6, gt=0.0, le=1.0, description="AdamW learning rate.")
    temperature: float = Field(
        default=1.0, gt=0.0, le=100.0, description="Sampling temperature; > 0 so a group's answers differ."
    )
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling probability mass.")
    top_k: Annotated[int, Field(ge=0, le=1_000_000), INTEGRAL_FLOAT] | None = Field(
        default=None,
        description="Sample only from the k most likely tokens; 0 or unset samples from all (TRL's default). "
        "Cuts the unlikely tail that yields garbage at high temperature, but also the exploration GRPO "
        "learns from: leave unset unless completions degenerate. Trainer-sampled rollouts only.",
    )
    min_p: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Drop tokens less likely than minP times the most likely token (0.01-0.1 is typical); unset "
        "keeps all (TRL's default). Like topK, but adapts to how confident the model is. Trainer-sampled "
        "rollouts only.",
    )
    repetition_penalty: float | None = Field(
        default=None,
        gt=0.0,
        le=10.0,
        description="Penalise tokens already in the prompt or completion by this factor (> 1 discourages "
        "repeating, < 1 encourages it); unset means 1.0, no penalty (TRL's default). The policy is trained "
        "on penalised samples it would not produce itself: stay near 1 (e.g. 1.05) if at all. "
        "Trainer-sampled rollouts only.",
    )
    chat_template_kwargs: (
        Annotated[dict[str, Annotated[str, Field(max_length=256)]], Field(max_length=16)] | None
    ) = Field(
        default=None,
        description="Extra variables for the model's chat template when prompts are rendered, e.g. "
        '{enable_thinking: "false"} for Qwen3\'s non-thinking mode. Values are strings (quote them in YAML); '
        '"true" and "false" reach the template as booleans, which is what templates test flags with. '
        "Unset: none. Applies wherever the trainer renders a chat (its own prompts, and a client's through "
        "the policy server).",
    )
    max_prompt_length: K8sInt = Field(
        default=512, ge=1, le=1_048_576, description="Prompts are truncated to this many tokens."
    )
    max_completion_length: K8sInt = Field(
        default=256, ge=1, le=1_048_576, description="Maximum tokens generated per completion."
    )
    beta: float = Field(
        default=0.0, ge=0.0, le=100.0, description="KL coefficient against the reference model; 0 skips it."
    )
    epsilon: float = Field(
        default=DEFAULT_EPSILON,
        gt=0.0,
        le=1.0,
        json_schema_extra=NO_SERVER_DEFAULT,
        description="Lower (and, without epsilonHigh, upper) clip of the importance ratio: how far one update "
        "may move a token's probability. Unset: the preset's, else 0.2.",
    )
    epsilon_high: float | None = Field(
        default=None,
        gt=0.0,
        le=10.0,
        description="Upper ratio clip (DAPO clip-higher, e.g. 0.28: lets unlikely tokens gain probability "
        "faster, against entropy collapse); for lossType cispo it caps the importance weight instead (TRL "
        "recommends 5). Unset: the preset's, else epsilon.",
    )
    loss_type: LossType = Field(
        default=DEFAULT_LOSS_TYPE,
        json_schema_extra=NO_SERVER_DEFAULT,
        description="How per-token losses become the step's loss (TRL loss_type): dapo (tokens of the whole "
        "batch), grpo (per sequence, then averaged: favours short correct and long wrong answers), bnpo "
        "(tokens of each process's batch), dr_grpo (divided by maxCompletionLength), cispo (clips the "
        "importance weight, not the update), sapo (a soft gate instead of the clip), luspo (sequence loss "
        "times its length; needs importanceSamplingLevel sequence), vespo (a smooth sequence-level "
        "weighting; needs vllmImportanceSamplingMode token_truncate or token_mask). Unset: the preset's, "
        "else dapo (TRL 1.16's default).",
    )
    importance_sampling_level: Literal["token", "sequence"] | None = Field(
        default=None,
        description="Importance ratio (new / old policy) per token, or one per sequence: the geometric mean of "
        "its token ratios (GSPO), clipped as a whole, which matches a reward given to the whole answer and "
        "is steadier when data is reused (numIterations >= 2). Unset: the preset's, else token (TRL's "
        "default).",
    )
    num_iterations: Annotated[int, Field(ge=1, le=8), INTEGRAL_FLOAT] | None = Field(
        default=None,
        description="Optimizer steps taken on each generated batch (TRL num_iterations, mu): 1 (unset, TRL's "
        "default) trains on-policy; 2-4 get more learning per rollout, with the ratio clip (epsilon) keeping "
        "each reuse close to the policy that sampled. S steps then generate ceil(S / numIterations) batches. "
        "Not with client rollouts.",
    )
    max_staleness: Annotated[int, Field(ge=0, le=8), INTEGRAL_FLOAT] | None = Field(
        default=None,
        description="Asynchronous GRPO, eta: vLLM samples the groups of the next steps while the trainer trains, "
        "and no group is trained more than maxStaleness optimizer steps after the weights that sampled it "
        "(the vLLM importance-sampling correction reweights it to the trained weights). Unset or 0: "
        "synchronous, each step samples with the weights it trains. 1 overlaps one step of sampling with "
        "each step of training; more only helps when one step's sampling takes longer than its training. "
        "Not with client rollouts, numIterations > 1 or dynamicSampling.",
    )
    mask_truncated_completions: bool | None = Field(
        default=None,
        description="Leave completions cut at maxCompletionLength out of the loss: an unfinished answer scored "
        "as wrong teaches the model that long reasoning is bad (DAPO's overlong filtering). Unset: the "
        "preset's, else false (TRL's default). Raise maxCompletionLength if many are cut.",
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        default="group",
        json_schema_extra=NO_SERVER_DEFAULT,
        description="Divide advantages by the group's population std (group), the batch std (batch), "
        "or not at all (none). Unset: the preset's, else group.",
    )
    format_failure_score: float = Field(
        default=-1.0,
        ge=-1e6,
        le=1e6,
        description="Reward for unparseable output; must be below failureScore.",
    )
    failure_score: float = Field(
        default=0.0, ge=-1e6, le=1e6, description="Reward the metric gives a parseable but wrong answer."
    )
    dynamic_sampling: bool = Field(
        default=False,
        json_schema_extra=NO_SERVER_DEFAULT,
        description="Drop groups whose rewards are all equal and sample new prompts to refill (DAPO). Unset: "
        "the preset's, else false.",
    )
    vllm_importance_sampling_correction: bool | None = Field(
        default=None,
        description="Reweight each completion by trainer / vLLM probability of its tokens, correcting for the "
        "two engines' numeric differences (sampling from vLLM makes training slightly off-policy). Unset: on "
        "(TRL's default); false trusts vLLM's samples as the policy's. Trainer-sampled rollouts only.",
    )
    vllm_importance_sampling_mode: ImportanceSamplingMode | None = Field(
        default=None,
        description="How that correction treats a ratio above vllmImportanceSamplingCap: *_truncate caps it, "
        "*_mask drops the token (token_*) or the whole completion (sequence_*) from the loss. Unset: "
        "sequence_mask (TRL's default). Trainer-sampled rollouts only.",
    )
    vllm_importance_sampling_cap: float | None = Field(
        default=None,
        gt=1.0,
        le=1000.0,
        description="Upper bound of that ratio (TRL vllm_importance_sampling_clip_max): lower trusts fewer "
        "mismatched samples, higher lets rarer ones through with more weight. Unset: 3 (TRL's default). "
        "Trainer-sampled rollouts only.",
    )
    seed: K8sInt = Field(
        default=42, ge=0, le=2**31 - 1, description="Seed for data order, sampling and init."
    )
    lora: LoraSpec = Field(default_factory=LoraSpec, description="LoRA adapters instead of full fine-tuning.")
    validation: ValidationSpec = Field(default_factory=ValidationSpec, description="Periodic validation.")
    learning_health: LearningHealthSpec | None = Field(
        default=None,
        description="Thresholds of the learning-health diagnosis (status.learning, condition "
        "LearningHealthy); unset fields take the platform's defaults, then the built-in ones.",
    )

    @field_validator("chat_template_kwargs")
    @classmethod
    def _not_reserved(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        # The twin of Rules.chat_template_kwargs_not_reserved; a field validator, so the error is reported at
        # the field, as the rule's fieldPath makes the API server report it.
        if value is not None and any(key in value for key in RESERVED_CHAT_TEMPLATE_KWARGS):
            raise cls.Rules.chat_template_kwargs_not_reserved.violation()
        return value

    @model_validator(mode="after")
    def _cross_field(self) -> GRPOSpec:
        if not self.format_failure_score < self.failure_score:
            raise self.Rules.format_failure_below_failure.violation()
        epsilon = self.effective("epsilon")
        epsilon_high = self.effective("epsilon_high")
        if epsilon_high is not None and epsilon_high < epsilon:
            raise self.Rules.epsilon_high_at_least_epsilon.violation()
        if self.max_staleness:
            if (self.effective("num_iterations") or 1) > 1:
                raise self.Rules.async_not_with_several_iterations.violation()
            if self.effective("dynamic_sampling"):
                raise self.Rules.async_not_with_dynamic_sampling.violation()
            if self.vllm_importance_sampling_correction is False:
                raise self.Rules.async_keeps_the_correction.violation()
        if (
            self.effective("loss_type") == "luspo"
            and self.effective("importance_sampling_level") != "sequence"
        ):
            raise self.Rules.luspo_needs_sequence_level.violation()
        return self

    # -- presets -------------------------------------------------------------------------------------------

    def is_set(self, name: str) -> bool:
        """Whether the spec sets knob ``name`` itself (present in the manifest, not null)."""
        return name in self.model_fields_set and getattr(self, name) is not None

    def effective(self, name: str, *, sampled_by_client: bool = False) -> Any:
        """The value training uses for knob ``name``: the spec's when set, else the preset's, else the default.
        ``sampled_by_client`` (spec.rollouts.source: Client) leaves out the preset's sampling knobs."""
        if self.is_set(name):
            return getattr(self, name)
        preset = PRESETS[self.preset] if self.preset is not None else None
        if preset is None or name not in preset.knobs:
            return getattr(self, name)
        if sampled_by_client and name in preset.trainer_sampling:
            return getattr(self, name)
        return preset.knobs[name]

    def resolved(self, *, sampled_by_client: bool = False) -> GRPOSpec:
        """A copy with the preset's knobs filled in (and counted as set, so resolving again changes nothing):
        what trainer.json carries."""
        if self.preset is None:
            return self.model_copy(deep=True)
        knobs = {
            name: self.effective(name, sampled_by_client=sampled_by_client)
            for name in PRESETS[self.preset].knobs
        }
        return self.model_copy(update=knobs, deep=True)

    def preset_summary(self, *, sampled_by_client: bool = False) -> str | None:
        """What the preset resolved to, one line (None without a preset): for the job's Created event."""
        if self.preset is None:
            return None
        names = PRESETS[self.preset].knobs
        values = {name: self.effective(name, sampled_by_client=sampled_by_client) for name in names}
        return describe(self.preset, values, {n for n in names if self.is_set(n)}, sampled_by_client)

    def chat_template_arguments(self) -> dict[str, str | bool]:
        """chatTemplateKwargs as the template gets them: "true" and "false" as booleans (templates test flags
        such as enable_thinking with `is false`, which the string "false" would not pass)."""
        booleans = {"true": True, "false": False}
        return {k: booleans.get(v, v) for k, v in (self.chat_template_kwargs or {}).items()}
