"""The operator's own copy of the status fields it decides from, and a status read defensively.

Trainer rank 0 may patch its job's status (to report progress), and the status subresource cannot tell
one field from another: tenant code could write ``restarts: 0`` to escape backoffLimit, ``phase:
Succeeded`` to end the job, ``trainerAttempt: 99`` or a ``startTime`` in the future to escape
activeDeadlineSeconds, or a ``gatewayTokenSecret`` naming a Secret whose value it chose. So the
operator keeps the fields its decisions rest on (phase, restarts, trainerAttempt, startTime,
completionTime, gatewayTokenSecret) in an annotation on the GRPOJob as well, which only a
writer of the job's metadata can change (the trainer's Role grants the status subresource alone), and
decides from that copy. The status is rewritten from the decision on every reconcile, so a forged
value does not stay. Conditions, reason and message are rebuilt from the operator's own types; every
value read from the status is type-checked, so no payload can crash a reconcile.
"""

from __future__ import annotations

import json
import re
from typing import Any

from grpo_operator.api.status import (
    GATEWAY_TOKEN_SECRET_FIELD,
    PHASES,
    SECRET_NAME_PATTERN,
    TERMINAL_PHASES,
    TRAINER_STATUS_FIELDS,
)
from grpo_operator.reconcile.conditions import CONDITION_ORDER, FAILED, SUCCEEDED
from grpo_operator.reconcile.observed import parse_time

ANNOTATION_RECORD = "grpo.dev/status-record"
# The status fields the operator decides from, recorded on the job's metadata.
TRUSTED_FIELDS = (
    "phase",
    "restarts",
    "trainerAttempt",
    "generationAttempt",
    "generationKeptAtStep",
    "startTime",
    "completionTime",
    GATEWAY_TOKEN_SECRET_FIELD,
)
_MAX_RECORD = 4096

Obj = dict[str, Any]


def _count(value: Any) -> int | None:
    """A non-negative integer, or None for anything else (bool, float, text, negative)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if value >= 0 else None


def _time(value: Any) -> str | None:
    return value if isinstance(value, str) and parse_time(value) is not None else None


def _clean_trusted(source: Obj) -> Obj:
    out: Obj = {}
    phase = source.get("phase")
    if isinstance(phase, str) and phase in PHASES:
        out["phase"] = phase
    for key in ("restarts", "trainerAttempt", "generationAttempt", "generationKeptAtStep"):
        count = _count(source.get(key))
        if count is not None:
            out[key] = count
    for key in ("startTime", "completionTime"):
        moment = _time(source.get(key))
        if moment is not None:
            out[key] = moment
    secret = source.get(GATEWAY_TOKEN_SECRET_FIELD)
    if isinstance(secret, str) and len(secret) <= 253 and re.fullmatch(SECRET_NAME_PATTERN, secret):
        out[GATEWAY_TOKEN_SECRET_FIELD] = secret
    return out


def read_record(job_obj: Obj) -> Obj | None:
    """The operator's record on the job, or None when there is none (a job the operator has not yet
    decided for, or one made by an operator version without records) or it is unreadable."""
    meta = job_obj.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    text = annotations.get(ANNOTATION_RECORD) if isinstance(annotations, dict) else None
    if not isinstance(text, str) or len(text) > _MAX_RECORD:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return _clean_trusted(value) if isinstance(value, dict) else None


def trusted_fields(status: Obj) -> Obj:
    """The record to keep for a status the operator decided."""
    return {k: status[k] for k in TRUSTED_FIELDS if status.get(k) is not None}


def record_annotation(record: Obj) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


def _clean_conditions(value: Any, phase: str | None) -> list[Obj]:
    if not isinstance(value, list):
        return []
    out: list[Obj] = []
    seen: set[str] = set()
    for cond in value:
        if not isinstance(cond, dict):
            continue
        type_, status = cond.get("type"), cond.get("status")
        if type_ not in CONDITION_ORDER or type_ in seen or status not in ("True", "False", "Unknown"):
            continue
        # Success and failure are the operator's verdicts: one that disagrees with the recorded phase is forged.
        if type_ in (SUCCEEDED, FAILED) and status == "True" and phase != type_:
            continue
        clean: Obj = {"type": type_, "status": status}
        for key in ("reason", "message"):
            if isinstance(cond.get(key), str):
                clean[key] = cond[key]
        moment = _time(cond.get("lastTransitionTime"))
        if moment is not None:
            clean["lastTransitionTime"] = moment
        generation = _count(cond.get("observedGeneration"))
        if generation is not None:
            clean["observedGeneration"] = generation
        seen.add(type_)
        out.append(clean)
    return out


def sanitize_status(status: Obj, record: Obj | None) -> Obj:
    """The status to decide from: trusted fields from ``record`` (from the status itself only when there is
    no record yet), every other field type-checked; the trainer's sections kept only as objects."""
    out = _clean_trusted(record if record is not None else status)
    phase = out.get("phase")
    for key in ("reason", "message"):
        if isinstance(status.get(key), str):
            out[key] = status[key]
    conditions = _clean_conditions(status.get("conditions"), phase)
    if conditions:
        out["conditions"] = conditions
    for key in ("rollouts", "observedGeneration"):
        count = _count(status.get(key))
        if count is not None:
            out[key] = count
    for key in TRAINER_STATUS_FIELDS:
        if isinstance(status.get(key), dict):
            out[key] = status[key]
    if phase not in TERMINAL_PHASES:
        out.pop("completionTime", None)
    return out
