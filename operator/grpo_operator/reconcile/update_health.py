"""The UpdatesEffective condition: trainer rank 0's check that its optimizer steps change the weights
(status.updates), turned into a condition users and alerts can select on, with a Warning event naming the
likely cause when the updates vanish.

status.updates is written by the tenant's trainer image: it is read only through its pydantic model, and
the message is built from its typed fields alone (numbers, a dtype and a cause from fixed lists), never
from text the trainer wrote.
"""

from __future__ import annotations

from pydantic import ValidationError

from grpo_operator.api import event_reasons
from grpo_operator.api.status import UpdateCause, UpdatesStatus
from grpo_operator.reconcile.conditions import UPDATES_EFFECTIVE, get_condition
from grpo_operator.reconcile.reconcile_pass import ReconcilePass

# Half the rounding step of each half-precision dtype, relative to the weight (2^-(mantissa bits + 1)).
_HALF_ULP = {"bfloat16": "2^-8, about 0.4 %", "float16": "2^-11, about 0.05 %"}


def read_updates(status: dict[str, object]) -> UpdatesStatus | None:
    raw = status.get("updates")
    if not isinstance(raw, dict):
        return None
    try:
        return UpdatesStatus.model_validate(raw)
    except ValidationError:
        return None


def _rate(updates: UpdatesStatus) -> str:
    return f"{updates.learning_rate:.2g}" if updates.learning_rate is not None else "unknown"


def _fix(cause: UpdateCause | None, updates: UpdatesStatus) -> str:
    dtype = updates.weight_dtype or "half precision"
    rate = _rate(updates)
    if cause == "Precision":
        half = _HALF_ULP.get(dtype, "half its rounding step")
        return (
            f"the trainable weights are held in {dtype} and the learning rate is {rate}: an update smaller than "
            f"half a {dtype} rounding step ({half} of the weight) is rounded away, so the model barely "
            "moves. This operator's trainer holds the trainable weights in float32 under 16-bit compute "
            "(docs/trainer.md, Precision); a trainer image that holds them in 16 bits is an older or a custom "
            "one (spec.trainer.image): use the default trainer image, set spec.model.dtype: float32, or raise "
            "spec.grpo.learningRate"
        )
    if cause == "TiedGroups":
        return (
            "every group's rewards were equal, so every advantage was 0 and the steps had no gradient: the "
            "prompts are all too easy or all too hard for the model now, or the metric answers a constant "
            "(status.rewards.zeroStdGroupRatio is 1). Make the reward graded, raise spec.grpo.groupSize or "
            "the temperature, or turn on spec.grpo.dynamicSampling"
        )
    if cause == "TruncatedCompletionsMasked":
        return (
            "every completion was cut off at spec.grpo.maxCompletionLength and "
            "spec.grpo.maskTruncatedCompletions left them all out of the loss, so the steps had no gradient. "
            "Raise maxCompletionLength, ask the prompts for shorter answers, or turn "
            "maskTruncatedCompletions off"
        )
    return (
        f"the weights are held in {updates.weight_dtype or 'an unknown dtype'} and the learning rate {rate} "
        "is too small to change them. Raise spec.grpo.learningRate"
    )


def vanishing_message(updates: UpdatesStatus) -> str:
    start = (
        updates.checked_step - (updates.vanishing_steps or 1) + 1
        if updates.checked_step is not None
        else None
    )
    since = f"since step {max(start, 0)}" if start is not None else "for several steps"
    return (
        f"{since}, each optimizer step changed almost none of the trainable weights (under 1 % of a fixed "
        "sample of their elements, or an update-to-weight ratio under 1e-8; status.updates has the last "
        f"step's figures): the run computes gradients and learns nothing. Likely cause: {_fix(updates.cause, updates)}"
    )


def updates_condition(rp: ReconcilePass) -> None:
    updates = read_updates(rp.old)
    if updates is None or updates.vanishing is None:
        return
    if not updates.vanishing:
        # A message without the step's figures: it would change (and cost a status write) every step.
        rp.condition(
            UPDATES_EFFECTIVE,
            "True",
            "UpdatesApplied",
            "the optimizer steps change the trainable weights (status.updates has the last step's "
            "update-to-weight ratio and the fraction of sampled elements that changed)",
        )
        return
    message = vanishing_message(updates)
    previous = get_condition(list(rp.old.get("conditions") or []), UPDATES_EFFECTIVE)
    rp.condition(UPDATES_EFFECTIVE, "False", "UpdatesVanishing", message)
    if previous is None or previous.get("status") != "False":
        rp.event(event_reasons.UPDATES_VANISHING, message)
