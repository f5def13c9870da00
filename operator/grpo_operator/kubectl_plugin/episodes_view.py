"""``kubectl grpo samples`` for a job with ``spec.environment``: each episode of episodes.jsonl under its
prompt, with its outcome and reward, then turn by turn the model's text, its action and what the
environment answered, and which of those tokens the loss trained.

Which tokens were trained is not taken on the file's word: a turn's sampled ids are looked up at their
place in ``trainedIds`` (the completion the loss saw: every turn's ids, then its environment tokens) and
counted as trained where they are there unchanged under ``trainedMask`` 1. Anything else (another id, a
sampled token masked out, an environment token trained, lengths that do not add up) is a MISMATCH.

Rank 0 writes the file from what the tenant's model and environment produced, so every field is untrusted:
a value of the wrong type is shown as missing, text is clipped and wrapped as samples are, at most
``MAX_TURNS`` turns are shown, and the text returned is terminal-safe on its own (``out`` escapes it
again, which changes nothing)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grpo_operator.api.environment import MAX_TURNS
from grpo_operator.kubectl_plugin.data import as_float, step_of
from grpo_operator.kubectl_plugin.render import clip, group_head, terminal_safe, wrap

# An action is a tool call's arguments or a message, not a document: a longer one is cut sooner.
ACTION_LIMIT = 4 << 10
# Characters of an unexpected outcome kept on the episode's head line.
WORD_LIMIT = 40
OUTCOMES = {
    "done": "done",
    "truncated": "TRUNCATED",
    "format_failure": "FORMAT FAILURE",
    "environment_error": "ENVIRONMENT ERROR",
}


def wanted(job: dict[str, Any], flag: bool | None) -> bool:
    """Whether ``samples`` shows episodes: ``--episodes``/``--no-episodes`` when given, else whether the
    job has ``spec.environment``. The spec decides rather than which files exist: an environment job
    writes samples.jsonl (the transcripts) as well, and before its first step neither file exists, where
    ``--follow`` must already know which one to wait for."""
    if flag is not None:
        return flag
    spec = job.get("spec")
    return isinstance(spec, dict) and isinstance(spec.get("environment"), dict)


def token_ids(value: Any) -> list[int] | None:
    """``value`` when it is a list of integers (token ids or mask entries), else None."""
    if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return value
    return None


@dataclass
class TurnTokens:
    """One turn's tokens and, when the record has ``trainedIds``/``trainedMask``, what the loss made of
    them."""

    sampled: int  # the model's tokens, as vLLM sampled them
    environment: int  # the tokens appended after them: the chat template's glue and the observation
    trained: int | None = None  # sampled tokens in place in trainedIds under mask 1; None: not recorded
    differ: int = 0  # sampled tokens whose place in trainedIds holds another id, or lies past its end
    environment_trained: int = 0  # environment tokens under mask 1: trained, though never sampled
    environment_differ: int = 0

    @property
    def model_mismatch(self) -> bool:
        return self.trained is not None and (self.differ > 0 or self.trained < self.sampled)

    @property
    def environment_mismatch(self) -> bool:
        return self.environment_trained > 0 or self.environment_differ > 0


@dataclass
class Training:
    turns: list[TurnTokens]
    recorded: bool  # the record has trainedIds and trainedMask, both lists of integers
    trained: int  # entries of trainedMask that are 1 (within trainedIds)
    total: int  # tokens of trainedIds when recorded, else of the turns
    problems: list[str]

    @property
    def mismatch(self) -> bool:
        return bool(self.problems) or any(t.model_mismatch or t.environment_mismatch for t in self.turns)


def _turns(record: dict[str, Any]) -> list[Any]:
    turns = record.get("turns")
    return turns if isinstance(turns, list) else []


def training(record: dict[str, Any]) -> Training:
    """Each turn's tokens compared, position by position, with what the loss trained."""
    ids, mask = token_ids(record.get("trainedIds")), token_ids(record.get("trainedMask"))
    recorded = ids is not None and mask is not None
    problems: list[str] = []
    if not recorded and ("trainedIds" in record or "trainedMask" in record):
        problems.append(
            "trainedIds and trainedMask are not both lists of integers: what was trained is unknown"
        )
    turns: list[TurnTokens] = []
    cursor = 0
    for turn in _turns(record):
        fields = turn if isinstance(turn, dict) else {}
        sampled = token_ids(fields.get("ids")) or []
        appended = token_ids(fields.get("observationIds")) or []
        tokens = TurnTokens(len(sampled), len(appended))
        if ids is not None and mask is not None:
            tokens.trained = 0
            for offset, token in enumerate(sampled + appended):
                at = cursor + offset
                model = offset < len(sampled)
                if at >= len(ids) or ids[at] != token:
                    if model:
                        tokens.differ += 1
                    else:
                        tokens.environment_differ += 1
                elif at < len(mask) and mask[at] == 1:
                    if model:
                        tokens.trained += 1
                    else:
                        tokens.environment_trained += 1
        cursor += len(sampled) + len(appended)
        turns.append(tokens)
    if ids is None or mask is None:
        return Training(turns, False, 0, cursor, problems)
    if len(mask) != len(ids):
        problems.append(
            f"trainedMask has {len(mask)} entries for {len(ids)} trainedIds (a token without one counts as not trained)"
        )
    if len(ids) != cursor:
        problems.append(f"trainedIds has {len(ids)} tokens, the turns {cursor}")
    odd = sum(1 for m in mask if m not in (0, 1))
    if odd:
        problems.append(f"trainedMask has {odd} entries other than 0 and 1")
    trained = sum(1 for m in mask[: len(ids)] if m == 1)
    return Training(turns, True, trained, len(ids), problems)


def _text(value: Any) -> str:
    """Text as the file has it; a value of another type is named, not shown (its repr could be anything)."""
    if isinstance(value, str):
        return value
    return f"[{type(value).__name__}, not text]"


def _one_line(value: Any, limit: int = WORD_LIMIT) -> str:
    text = " ".join(_text(value)[: 4 * limit].split())
    return text if len(text) <= limit else f"{text[:limit]}…"


def _action(value: Any) -> str:
    if isinstance(value, str):
        return clip(value, ACTION_LIMIT)
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return _text(value)
    return clip(text, ACTION_LIMIT)


def block(text: str, width: int, prefix: str) -> list[str]:
    """``text`` cut at ``render.TEXT_LIMIT`` and wrapped under ``prefix``, as samples show completions."""
    lines: list[str] = []
    for para in clip(text).splitlines() or [""]:
        lines.extend(prefix + piece for piece in wrap(para, max(8, width - len(prefix))))
    return lines


def _tokens(n: int) -> str:
    return f"{n} token" if n == 1 else f"{n} tokens"


def episode_head(record: dict[str, Any], counted: Training) -> str:
    index = record.get("index")
    parts = [f"EPISODE {index if isinstance(index, int) and not isinstance(index, bool) else '-'}"]
    outcome = record.get("outcome")
    if isinstance(outcome, str) and outcome in OUTCOMES:
        parts.append(OUTCOMES[outcome])
    else:
        parts.append("outcome -" if outcome is None else f"outcome {_one_line(outcome)!r}")
    reward = as_float(record.get("reward"))
    parts.append(f"reward {reward:+.4f}" if reward is not None else "reward - (not scored)")
    turns = _turns(record)
    parts.append(f"{len(turns)} turn" if len(turns) == 1 else f"{len(turns)} turns")
    round_index = record.get("round")
    if isinstance(round_index, int) and not isinstance(round_index, bool) and round_index > 0:
        parts.append(f"refill round {round_index}")
    if record.get("trained") is False:
        # Dynamic sampling dropped its group (every reward equal) for a group with something to learn.
        parts.append(f"{_tokens(counted.total)}, not trained (tied group replaced)")
    elif counted.recorded:
        parts.append(f"{counted.trained} of {_tokens(counted.total)} trained")
    else:
        parts.append(f"{_tokens(counted.total)}, training not recorded")
    if counted.mismatch:
        parts.append("MISMATCH")
    return "  ".join(parts)


def _model_label(tokens: TurnTokens) -> str:
    if tokens.trained is None:
        return f"model · {_tokens(tokens.sampled)}, training not recorded"
    if not tokens.model_mismatch:
        return "model · no tokens" if not tokens.sampled else f"model · trained ({_tokens(tokens.sampled)})"
    label = f"model · MISMATCH: {tokens.trained} of {_tokens(tokens.sampled)} trained"
    if tokens.differ:
        label += f", {tokens.differ} not at their place in trainedIds"
    return label


def _environment_label(tokens: TurnTokens, observed: bool) -> str:
    none = "" if observed else ", no observation"
    if not tokens.environment_mismatch:
        return f"environment · not trained ({_tokens(tokens.environment)}{none})"
    label = f"environment · MISMATCH: {tokens.environment_trained} of {_tokens(tokens.environment)} trained"
    if tokens.environment_differ:
        label += f", {tokens.environment_differ} not at their place in trainedIds"
    return label + none


def turn_lines(turn: Any, number: int, of: int, tokens: TurnTokens, width: int) -> list[str]:
    if not isinstance(turn, dict):
        return [f"  turn {number} of {of}: [{type(turn).__name__}, not an object]"]
    head = f"  turn {number} of {of}"
    reward, seconds = as_float(turn.get("reward")), as_float(turn.get("stepSeconds"))
    if reward is not None:
        head += f"  reward {reward:+.4f}"
    if seconds is not None:
        head += (
            f"  environment step {seconds:.3f} s" if seconds < 1 else f"  environment step {seconds:.1f} s"
        )
    lines = [head, f"    {_model_label(tokens)}"]
    malformed = [k for k in ("ids", "observationIds") if k in turn and token_ids(turn[k]) is None]
    if malformed:
        lines.append(f"    [{' and '.join(malformed)} not a list of token ids: counted as none]")
    text = turn.get("text", "")
    if text != "" or tokens.sampled:
        lines.extend(block(_text(text), width, "      │ "))
    if turn.get("action") is not None:
        lines.append("    action")
        lines.extend(block(_action(turn["action"]), width, "      │ "))
    observation = turn.get("observation")
    if observation is not None or tokens.environment:
        lines.append(f"    {_environment_label(tokens, observation is not None)}")
        if observation is not None:
            lines.extend(block(_text(observation), width, "      │ "))
    return lines


def episode_lines(record: dict[str, Any], width: int = 100) -> list[str]:
    counted = training(record)
    lines = [episode_head(record, counted)]
    reason = record.get("reason")
    if reason is not None and reason != "":
        lines.extend(block(f"reason: {_text(reason)}", width, "  "))
    lines.extend(f"  MISMATCH: {problem}" for problem in counted.problems)
    if any(t.model_mismatch or t.environment_mismatch for t in counted.turns):
        lines.append(
            "  MISMATCH: the loss did not train exactly the tokens the model sampled (the turns say where)"
        )
    raw = record.get("turns")
    if raw is not None and not isinstance(raw, list):
        lines.append(f"  [turns is {type(raw).__name__}, not a list: no turn to show]")
    turns = _turns(record)
    for number, (turn, tokens) in enumerate(zip(turns[:MAX_TURNS], counted.turns, strict=False), start=1):
        lines.extend(turn_lines(turn, number, len(turns), tokens, width))
    if len(turns) > MAX_TURNS:
        lines.append(
            f"  … {len(turns) - MAX_TURNS} more turns not shown (an episode has at most {MAX_TURNS})"
        )
    return lines


def episodes_text(episodes: Sequence[dict[str, Any]], width: int = 100) -> str:
    """Episodes under their prompt (a GRPO group's G episodes share it), each a head line then its turns."""
    groups: list[list[dict[str, Any]]] = []
    key: tuple[Any, Any] | None = None
    for episode in episodes:
        prompt = episode.get("prompt")
        this = (step_of(episode), prompt if isinstance(prompt, str) else None)
        if this != key:
            key = this
            groups.append([])
        groups[-1].append(episode)
    lines: list[str] = []
    for group in groups:
        first = group[0]
        if lines:
            lines.append("")
        lines.append(f"── step {step_of(first)} · episodes ──")
        lines.append("PROMPT")
        lines.extend(block(_text(first.get("prompt", "")), width, "  │ "))
        lines.append(group_head(group, "episodes"))
        for episode in group:
            lines.extend(episode_lines(episode, width))
    return terminal_safe("\n".join(lines))
