"""The LearningHealthy condition: trainer rank 0's diagnosis of whether the job learns (status.learning),
turned into a condition users and alerts can select on, with one event per change of diagnosis.

status.learning is written by the tenant's trainer image: it is read only through its pydantic model, and
the message is built from its typed fields by api.learning_health.describe, never from text the trainer
wrote. The message is rewritten only when the reason changes: its figures move every step, and a
condition that changed with them would cost a status write per trainer report.
"""

from __future__ import annotations

from pydantic import ValidationError

from grpo_operator.api import event_reasons
from grpo_operator.api.learning_health import LearningStatus, describe
from grpo_operator.reconcile.conditions import LEARNING_HEALTHY, get_condition
from grpo_operator.reconcile.reconcile_pass import ReconcilePass

HEALTHY_MESSAGE = (
    "no learning-health diagnosis holds over the last steps (status.learning has the figures; "
    "kubectl grpo status prints them)"
)


def read_learning(status: dict[str, object]) -> LearningStatus | None:
    raw = status.get("learning")
    if not isinstance(raw, dict):
        return None
    try:
        return LearningStatus.model_validate(raw)
    except ValidationError:
        return None


def learning_condition(rp: ReconcilePass) -> None:
    learning = read_learning(rp.old)
    if learning is None:
        return
    previous = get_condition(list(rp.old.get("conditions") or []), LEARNING_HEALTHY)
    was_reason = previous.get("reason") if previous is not None else None
    status = "True" if learning.healthy else "False"
    if learning.reason == "Healthy":
        message = HEALTHY_MESSAGE
    elif was_reason == learning.reason and previous is not None and previous.get("status") == status:
        message = str(previous.get("message") or describe(learning))
    else:
        message = describe(learning)
    rp.condition(LEARNING_HEALTHY, status, learning.reason, message)
    if was_reason == learning.reason:
        return
    if not learning.healthy:
        rp.event(event_reasons.NOT_LEARNING, message)
    elif learning.reason == "Solved":
        rp.event(event_reasons.LEARNING_SOLVED, message)
    elif previous is not None and previous.get("status") == "False":
        rp.event(event_reasons.LEARNING_RECOVERED, message)
