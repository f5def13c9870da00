"""The ServedModelInSync condition: trainer rank 0's probe of the vLLM server (status.servedModel), turned
into a condition users and alerts can select on, with a Warning event when it turns False."""

from __future__ import annotations

from grpo_operator.api import event_reasons
from grpo_operator.reconcile.conditions import SERVED_MODEL_IN_SYNC, get_condition
from grpo_operator.reconcile.reconcile_pass import ReconcilePass

# The trainer's message is the tenant's code's words: only this much of it reaches the condition.
_MAX_TRAINER_MESSAGE = 512


def served_model_condition(rp: ReconcilePass) -> None:
    served = rp.old.get("servedModel")
    if not isinstance(served, dict) or not isinstance(served.get("inSync"), bool):
        return
    step = served.get("checkedStep")
    where = f"after the weight sync of step {step}" if isinstance(step, int) else "after the last weight sync"
    diff = served.get("logprobDiff")
    figure = f"{diff:.4f}" if isinstance(diff, int | float) and not isinstance(diff, bool) else "unknown"
    if served["inSync"]:
        rp.condition(
            SERVED_MODEL_IN_SYNC,
            "True",
            "LogprobsMatch",
            f"{where}, vLLM's log-probabilities of the probe text match the trained model's "
            f"(mean difference {figure})",
        )
        return
    said = served.get("message")
    # Printable characters only: the condition reaches terminals (kubectl describe, kubectl grpo status).
    detail = "".join(c for c in " ".join(said.split()) if c.isprintable()) if isinstance(said, str) else ""
    detail = detail[:_MAX_TRAINER_MESSAGE]
    message = (
        f"{where}, vLLM serves other weights than the trainer trains (mean log-probability difference "
        f"{figure}): {detail or 'see the trainer log'}. Completions come from a stale model, so training "
        "learns from the wrong samples: check spec.generation.weightSync and the trainer and vLLM logs"
    )
    previous = get_condition(list(rp.old.get("conditions") or []), SERVED_MODEL_IN_SYNC)
    rp.condition(SERVED_MODEL_IN_SYNC, "False", "ServedModelDrift", message)
    if previous is None or previous.get("status") != "False":
        rp.event(event_reasons.SERVED_MODEL_DRIFT, message)
