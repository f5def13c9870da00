"""Vanishing updates: does each optimizer step change the weights at all?

A weight held in bfloat16 changes only when its update is at least half its rounding step (2^-8 of its
magnitude, ~0.4 %): with Adam at learning rate 1e-6 almost no element of a ~0.02-sized weight gets there,
and a norm weight near 1.0 never does, so the steps compute gradients and change (nearly) nothing. Nothing
else in the logs shows it: the loss and rewards of a model that does not move look like a hard task.

Every optimizer step, every rank copies a fixed sample of the trainable parameters (up to SAMPLE_TENSORS
tensors chosen by name at the first step, spread over embedding, attention, MLP, norm and head; the first
SAMPLE_ELEMENTS elements of each) in the dtype they are held in, right before the optimizer step, and
compares after it: the update-to-weight ratio ||Δw|| / ||w|| and the fraction of elements that changed at
all. Rank 0 exports both and, when the fraction stays below VANISHING_FRACTION (or the ratio below
VANISHING_RATIO) for VANISHING_STEPS measured steps in a row, reports the likely cause in status.updates
(docs/trainer.md, "Vanishing updates"). The cost is a copy of at most 8 x 65,536 elements per step.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, get_args

import torch
from grpo_operator.api.status import UpdateCause, UpdatesStatus, WeightDtype

log = logging.getLogger("grpo_trainer.update_health")

SAMPLE_TENSORS = 8
SAMPLE_ELEMENTS = 65_536
# Fewer than 1 in 100 sampled elements changed: 99 % of the update was rounded away. Measured on 65,536
# N(0, 0.02) weights under AdamW with noisy gradients: bfloat16 at lr 1e-6 changes 2 % at the first step,
# 0.7 % at the third and 0.3 % later; at 1e-5 it changes 15 %, then 3-8 %; float32 changes about 99 %
# or more at any learning rate from 1e-7 up.
VANISHING_FRACTION = 0.01
# A relative change below float32's own rounding (2^-24, 6e-8, of a weight): whatever moves is rounding.
VANISHING_RATIO = 1e-8
# Measured steps in a row before the diagnosis: one still step (the first with LoRA's zero-initialised
# adapters, a step whose groups all tied) is no finding.
VANISHING_STEPS = 3
# Steps whose learning rate is below this share of the configured one (a warmup's first steps, the end of a
# decaying schedule) are not judged: small updates are what the schedule asks for there.
JUDGED_LEARNING_RATE_SHARE = 0.1

# Parameter kinds by name, in the order the sample takes them (one of each, then a second of the first
# three, ...): norm first so that a sample always has one.
KINDS = ("norm", "attention", "mlp", "embedding", "lm_head", "other")
_KIND_WORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("norm", ("norm", "ln_", "layernorm")),
    ("embedding", ("embed", "wte", "wpe")),
    ("lm_head", ("lm_head",)),
    ("attention", ("attn", "attention", "q_proj", "k_proj", "v_proj", "o_proj", "qkv")),
    ("mlp", ("mlp", "gate_proj", "up_proj", "down_proj", "fc1", "fc2", "c_fc", "ffn")),
)
_WEIGHT_DTYPES: frozenset[str] = frozenset(get_args(WeightDtype))
_HALF_DTYPES = frozenset({"bfloat16", "float16"})


def kind(name: str) -> str:
    """The kind of parameter a name is: norm, attention, mlp, embedding, lm_head or other."""
    lowered = name.lower()
    for label, words in _KIND_WORDS:
        if any(word in lowered for word in words):
            return label
    return "other"


def _spread(items: Sequence[str], count: int) -> list[str]:
    """``count`` of ``items`` evenly spaced from the first to the last (layers early, middle and late)."""
    if count >= len(items):
        return list(items)
    if count == 1:
        return [items[len(items) // 2]]
    return [items[round(i * (len(items) - 1) / (count - 1))] for i in range(count)]


def choose_sample(names: Iterable[str], count: int = SAMPLE_TENSORS) -> list[str]:
    """Up to ``count`` parameter names, spread over the kinds (KINDS order, round robin) and, within a kind,
    over the model's depth; deterministic for a model, in the model's order."""
    ordered = list(dict.fromkeys(names))
    by_kind: dict[str, list[str]] = {label: [] for label in KINDS}
    for name in ordered:
        by_kind[kind(name)].append(name)
    quota = dict.fromkeys(KINDS, 0)
    left = min(count, len(ordered))
    while left > 0:
        for label in KINDS:
            if left > 0 and quota[label] < len(by_kind[label]):
                quota[label] += 1
                left -= 1
    chosen = {name for label in KINDS for name in _spread(by_kind[label], quota[label])}
    return [name for name in ordered if name in chosen]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def sample_view(tensor: torch.Tensor, elements: int = SAMPLE_ELEMENTS) -> torch.Tensor:
    """The first ``elements`` elements of the flattened tensor, in its own dtype (a view when it can be). A
    parameter sharded by FSDP2 (a DTensor) is sampled in this rank's own shard: gathering it would be a
    collective, and the shard is held in the same dtype as the whole."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.detach().reshape(-1)[:elements]


@dataclass(frozen=True)
class UpdateSample:
    """One optimizer step's change of the sampled weights."""

    # ||after - before|| / ||after|| over the whole sample; None when not a number (a zero sample that moved).
    ratio: float | None
    fraction: float  # sampled elements whose value changed at all
    elements: int
    dtype: str | None  # the dtype most sampled elements are held in


def measure(before: Sequence[torch.Tensor], after: Sequence[torch.Tensor]) -> UpdateSample:
    """Compare copies taken before a step with the same elements after it. Changed means not equal in the
    held dtype, so a bfloat16 weight whose update rounded away counts as unchanged."""
    if len(before) != len(after):
        raise ValueError(f"{len(before)} tensors before the step, {len(after)} after")
    changed = elements = 0
    delta_sq = weight_sq = 0.0
    dtypes: Counter[str] = Counter()
    for old, new in zip(before, after, strict=True):
        if old.shape != new.shape:
            raise ValueError(f"a sampled tensor changed shape: {tuple(old.shape)} -> {tuple(new.shape)}")
        changed += int((new != old).sum().item())
        elements += new.numel()
        wide_new, wide_old = new.double(), old.double()
        delta_sq += float((wide_new - wide_old).square().sum().item())
        weight_sq += float(wide_new.square().sum().item())
        dtypes[dtype_name(new.dtype)] += new.numel()
    delta, weight = math.sqrt(delta_sq), math.sqrt(weight_sq)
    ratio: float | None = 0.0 if delta == 0 else (delta / weight if weight > 0 else None)
    if ratio is not None and not math.isfinite(ratio):
        ratio = None
    return UpdateSample(
        ratio=ratio,
        fraction=changed / elements if elements else 0.0,
        elements=elements,
        dtype=dtypes.most_common(1)[0][0] if dtypes else None,
    )


@dataclass
class UpdateProbe:
    """Copies the sample before each optimizer step and measures it after (every rank; DDP replicas agree)."""

    tensors: int = SAMPLE_TENSORS
    elements: int = SAMPLE_ELEMENTS
    names: list[str] | None = None
    _params: list[torch.Tensor] = field(default_factory=list)
    _before: list[torch.Tensor] | None = None

    def before_step(self, model: Any) -> None:
        if self.names is None:
            trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
            self.names = choose_sample(trainable, self.tensors)
            self._params = [trainable[name] for name in self.names]
            log.info(
                "update health: sampling the first %d elements of %s",
                self.elements,
                ", ".join(
                    f"{n} ({dtype_name(p.dtype)})" for n, p in zip(self.names, self._params, strict=True)
                )
                or "no trainable parameter",
            )
        with torch.no_grad():
            self._before = [sample_view(p, self.elements).clone() for p in self._params]

    def after_step(self) -> UpdateSample | None:
        """The step's change, or None without a copy from before it (or with nothing to sample)."""
        before, self._before = self._before, None
        if not before:
            return None
        with torch.no_grad():
            return measure(before, [sample_view(p, self.elements) for p in self._params])


@dataclass(frozen=True)
class StepSignal:
    """What a step's own figures say about its learning signal (rank 0's view of the step)."""

    learning_rate: float | None  # the rate the step applied (None: not logged)
    peak_learning_rate: float  # the configured rate
    zero_std_group_ratio: float  # groups whose rewards all tied: advantage 0
    truncated_ratio: float | None  # completions cut off at maxCompletionLength
    mask_truncated: bool  # maskTruncatedCompletions: the truncated ones are left out of the loss
    skipped: bool = False  # the fp16 GradScaler skipped the optimizer step

    def judged(self) -> bool:
        """Whether a still step means something: not skipped, not a schedule's near-zero rate."""
        if self.skipped:
            return False
        if self.learning_rate is None:
            return True
        return (
            self.learning_rate > 0
            and self.learning_rate >= JUDGED_LEARNING_RATE_SHARE * self.peak_learning_rate
        )

    def masked_cause(self) -> UpdateCause | None:
        """The step had no gradient from its completions at all: every group tied, or every completion
        truncated and masked."""
        if self.zero_std_group_ratio >= 1.0:
            return "TiedGroups"
        if self.mask_truncated and self.truncated_ratio is not None and self.truncated_ratio >= 1.0:
            return "TruncatedCompletionsMasked"
        return None


def still(sample: UpdateSample) -> bool:
    """The step changed (next to) nothing of the sample."""
    return sample.fraction < VANISHING_FRACTION or (
        sample.ratio is not None and sample.ratio < VANISHING_RATIO
    )


def choose_cause(samples: Sequence[UpdateSample], signals: Sequence[StepSignal]) -> UpdateCause:
    """The likely cause of a run of still steps: no gradient at all when every one of them had none (tied
    groups, masked truncations); else half-precision weights; else a learning rate too small."""
    masked = [signal.masked_cause() for signal in signals]
    if masked and all(masked):
        return Counter(masked).most_common(1)[0][0] or "TiedGroups"
    if any(sample.dtype in _HALF_DTYPES for sample in samples):
        return "Precision"
    return "LearningRate"


@dataclass(frozen=True)
class Verdict:
    vanishing: bool
    steps: int  # judged still steps in a row
    cause: UpdateCause | None


@dataclass
class VanishingDetector:
    """Rank 0's running judgement: vanishing after ``steps`` judged still steps in a row. Steps that are not
    judged (StepSignal.judged) neither extend nor break the run."""

    steps: int = VANISHING_STEPS
    _samples: list[UpdateSample] = field(default_factory=list)
    _signals: list[StepSignal] = field(default_factory=list)

    def observe(self, sample: UpdateSample, signal: StepSignal) -> Verdict:
        if signal.judged():
            if still(sample):
                self._samples.append(sample)
                self._signals.append(signal)
            else:
                self._samples.clear()
                self._signals.clear()
        run = len(self._samples)
        if run < self.steps:
            return Verdict(False, run, None)
        recent = slice(-self.steps, None)
        return Verdict(True, run, choose_cause(self._samples[recent], self._signals[recent]))


def status_body(
    step: int, sample: UpdateSample, verdict: Verdict, learning_rate: float | None
) -> dict[str, Any]:
    """status.updates for the step, validated as the operator will read it."""
    rate = learning_rate if learning_rate is not None and math.isfinite(learning_rate) else None
    model = UpdatesStatus.model_validate(
        {
            "checkedStep": step,
            "updateRatio": None if sample.ratio is None else min(float(f"{sample.ratio:.4g}"), 1e6),
            "updatedFraction": round(sample.fraction, 6),
            "weightDtype": sample.dtype if sample.dtype in _WEIGHT_DTYPES else None,
            "learningRate": None if rate is None else min(max(rate, 0.0), 1e3),
            "vanishing": verdict.vanishing,
            "vanishingSteps": min(verdict.steps, 10_000_000),
            "cause": verdict.cause,
        }
    )
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")


def describe(verdict: Verdict, sample: UpdateSample, learning_rate: float | None) -> str:
    """A log line for the diagnosis."""
    ratio = "n/a" if sample.ratio is None else f"{sample.ratio:.2e}"
    return (
        f"the last {verdict.steps} optimizer steps changed almost none of the sampled weights "
        f"(last step: {sample.fraction:.2%} of {sample.elements} elements held in {sample.dtype}, "
        f"update-to-weight ratio {ratio}, learning rate {learning_rate}); likely cause: {verdict.cause} "
        "(docs/trainer.md, 'Vanishing updates')"
    )


@dataclass(frozen=True)
class UpdateReport:
    """One step's figures for rank 0's outputs."""

    fields: dict[str, Any]  # metrics.jsonl
    status: dict[str, Any]  # status.updates
    sample: UpdateSample
    verdict: Verdict
    changed: bool  # the verdict turned (vanishing began or ended): worth a status patch at once


@dataclass
class UpdateHealth:
    """The progress callback's part: the probe on every rank around the optimizer step, the judgement on
    rank 0 when the step is logged."""

    probe: UpdateProbe = field(default_factory=UpdateProbe)
    detector: VanishingDetector = field(default_factory=VanishingDetector)
    _last: UpdateSample | None = None
    _skipped: bool = False
    _vanishing: bool = False

    def before_step(self, model: Any) -> None:
        if model is not None:
            self.probe.before_step(model)

    def after_step(self, skipped: bool) -> None:
        self._last, self._skipped = self.probe.after_step(), skipped

    def judge(self, step: int, signal: StepSignal) -> UpdateReport | None:
        """The step's report (None when it was not measured); logs a warning when vanishing begins."""
        sample, self._last = self._last, None
        if sample is None:
            return None
        if self._skipped:
            signal = replace(signal, skipped=True)
        verdict = self.detector.observe(sample, signal)
        changed = verdict.vanishing != self._vanishing
        self._vanishing = verdict.vanishing
        if changed and verdict.vanishing:
            log.warning("step %d: %s", step, describe(verdict, sample, signal.learning_rate))
        elif changed:
            log.info("step %d: the optimizer steps change the sampled weights again", step)
        return UpdateReport(
            fields={"update_ratio": sample.ratio, "updated_fraction": sample.fraction},
            status=status_body(step, sample, verdict, signal.learning_rate),
            sample=sample,
            verdict=verdict,
            changed=changed,
        )
