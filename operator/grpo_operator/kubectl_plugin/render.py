"""Terminal text for the plugin's subcommands (pure functions of the data they are given)."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from grpo_operator.api.builtin_rewards import COMPONENT_NAME_PATTERN, MAX_REWARD_COMPONENTS
from grpo_operator.api.learning_health import REASONS, describe
from grpo_operator.kubectl_plugin.data import as_float, learning_status, step_of
from grpo_operator.kubectl_plugin.forecast_view import gpu_hours_lines, spend_lines

BARS = "▁▂▃▄▅▆▇█"
# C0 controls but newline and tab, DEL, and C1 controls (U+009B is CSI on its own): what a terminal
# acts on rather than prints. Samples, metrics, the manifest and status text are written by the
# tenant's images, so any of them could clear the screen, set the window title, write the clipboard
# (OSC 52) or hide a link (OSC 8).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
TEXT_LIMIT = 64 << 10  # characters of one prompt or completion shown as text
LABEL = 16  # width of the label column of `status`
STATUS_WIDTH = 100  # `status` wraps its long lines (the learning-health diagnosis) at this width
# Marks a line of `status` that needs the user's action, as samples mark a FORMAT FAILURE: in capitals.
WARNING = "WARNING: "


def terminal_safe(text: str) -> str:
    """``text`` with every control character a terminal would act on written as a visible ``\\u00XX``
    escape. Inside a JSON or YAML string that escape means the same character again, so ``-o json``
    output stays valid and decodes to the original data."""
    return _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def sparkline(values: Sequence[float | None], width: int = 48) -> str:
    """A one-line chart of ``values``: each character is the mean of a run of values (so a long run
    fits ``width``), scaled between the series' minimum and maximum; a run without values is a space."""
    if not values:
        return ""
    buckets: list[float | None] = []
    size = max(1, -(-len(values) // width))  # ceil: at most `width` characters
    for start in range(0, len(values), size):
        present = [v for v in values[start : start + size] if v is not None]
        buckets.append(sum(present) / len(present) if present else None)
    known = [b for b in buckets if b is not None]
    if not known:
        return " " * len(buckets)
    low, high = min(known), max(known)
    span = high - low
    chars = []
    for b in buckets:
        if b is None:
            chars.append(" ")
        elif span == 0:  # flat (often 0% format failures): the bottom bar, not a misleading middle
            chars.append(BARS[0])
        else:
            chars.append(BARS[min(len(BARS) - 1, int((b - low) / span * len(BARS)))])
    return "".join(chars)


def number(value: Any, digits: int = 4) -> str:
    known = as_float(value)
    return f"{known:.{digits}f}" if known is not None else "-"


def percent(value: Any) -> str:
    known = as_float(value)
    return f"{100 * known:.1f}%" if known is not None else "-"


def age(stamp: str | None, now: datetime | None = None) -> str:
    """``3m12s ago`` for an RFC 3339 time, as kubectl prints ages."""
    if not stamp:
        return "-"
    try:
        then = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return stamp
    seconds = int(((now or datetime.now(UTC)) - then).total_seconds())
    if seconds < 0:
        return "just now"
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        text = f"{days}d{hours}h"
    elif hours:
        text = f"{hours}h{minutes}m"
    elif minutes:
        text = f"{minutes}m{secs}s"
    else:
        text = f"{secs}s"
    return f"{text} ago"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded like ``kubectl get`` (three spaces between columns, no borders)."""
    widths = [len(h) for h in header]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = [
        "   ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in [header, *rows]
    ]
    return "\n".join(lines)


def trend_line(label: str, values: Sequence[float | None], fmt: Any) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return f"{label:<16}-"
    return (
        f"{label:<16}{fmt(known[-1])}  {sparkline(values)}  "
        f"(first {fmt(known[0])}, min {fmt(min(known))}, max {fmt(max(known))})"
    )


def cost_lines(status: dict[str, Any]) -> list[str]:
    """Rollouts and metric calls so far of planned, and GPU time by role (status.cost, from the trainer;
    before it reports, the operator's planned R alone)."""
    reported = status.get("cost")
    cost: dict[str, Any] = reported if isinstance(reported, dict) else {}
    planned = as_float(cost.get("rolloutsPlanned")) or as_float(status.get("rollouts"))
    lines: list[str] = []
    done = as_float(cost.get("rollouts"))
    if planned is not None or done is not None:
        so_far = f"{done:,.0f} of " if done is not None else ""
        lines.append(
            f"{'Rollouts':<16}{so_far}{planned:,.0f} (R)"
            if planned is not None
            else f"{'Rollouts':<16}{done:,.0f}"
        )
    calls, calls_planned = as_float(cost.get("metricCalls")), as_float(cost.get("metricCallsPlanned"))
    if calls is not None and calls_planned is not None:
        lines.append(f"{'Metric calls':<16}{calls:,.0f} of {calls_planned:,.0f}")
    generation, training = (
        as_float(cost.get("generationGpuSeconds")),
        as_float(cost.get("trainingGpuSeconds")),
    )
    if generation is not None and training is not None:
        lines.append(f"{'GPU time':<16}generation {gpu_time(generation)}, training {gpu_time(training)}")
    return lines


def gpu_time(seconds: float) -> str:
    """GPU time in the unit that fits: a tiny job's 12.6 GPU-seconds are not '0.00 GPU-h' (and a forged
    huge one is three digits, not three hundred)."""
    if seconds >= 3.6e9:
        return f"{seconds / 3600:.3g} GPU-h"
    if seconds < 60:
        return f"{seconds:.1f} GPU-s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} GPU-min"
    return f"{seconds / 3600:.2f} GPU-h"


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def eta(status: dict[str, Any]) -> str:
    """'   about N left' for a running job: the steps left at the last step's pace ('' when unknown)."""
    progress = status.get("progress") or {}
    step, total = as_float(progress.get("step")), as_float(progress.get("totalSteps"))
    pace = as_float(progress.get("stepDurationSeconds"))
    if status.get("phase") != "Running" or step is None or total is None or pace is None or total <= step:
        return ""
    return f", about {duration((total - step) * pace)} left"


def labelled(label: str, text: str, width: int = STATUS_WIDTH) -> list[str]:
    """``text`` after ``label`` in the label column, wrapped at ``width`` under the text's first character."""
    pieces = wrap(text, max(8, width - LABEL))
    return [f"{label if i == 0 else '':<{LABEL}}{piece}".rstrip() for i, piece in enumerate(pieces)]


def learning_lines(status: dict[str, Any], width: int = STATUS_WIDTH) -> list[str]:
    """The learning-health diagnosis (status.learning): since when, what was seen and what to change, then
    the figures it rests on. Nothing when it is absent or does not validate (the tenant's trainer writes it);
    a diagnosis that needs a change starts with WARNING."""
    learning = learning_status(status)
    if learning is None:
        return []
    text = describe(learning)
    if learning.reason == "Healthy":
        text = f"Healthy: {text}"
    if not learning.healthy or not REASONS[learning.reason].healthy:
        text = WARNING + text
    # describe() is one line (for the condition's message); here the change to make starts its own line.
    seen, change, fix = text.partition(". Change: ")
    lines = labelled("Learning", f"{seen}." if change else text, width)
    if change:
        lines.extend(labelled("", f"Change: {fix}", width))
    figures = [
        f"{name} {value:.4g}"
        for name, value in (learning.figures.named() if learning.figures else {}).items()
    ]
    if learning.update_cause is not None:
        figures.append(f"updateCause {learning.update_cause}")
    where = "".join(
        (
            f" at step {learning.checked_step}" if learning.checked_step is not None else "",
            f" over {learning.window_steps} steps" if learning.window_steps is not None else "",
        )
    )
    if figures:
        lines.extend(labelled("", f"figures{where}: {', '.join(figures)}", width))
    elif where:
        lines.extend(labelled("", f"checked{where}", width))
    # Every word above comes from the API's fixed table and typed numbers; escaped all the same.
    return [terminal_safe(line) for line in lines]


def status_text(report: dict[str, Any], now: datetime | None = None) -> str:
    """What ``kubectl grpo status`` prints; ``report`` is what ``-o json`` prints."""
    status: dict[str, Any] = report.get("status") or {}
    progress = status.get("progress") or {}
    rewards = status.get("rewards") or {}
    checkpoint = status.get("checkpoint") or {}
    lines = [f"GRPOJob {report['namespace']}/{report['name']}"]
    phase = status.get("phase") or "Pending (not yet seen by the operator)"
    reason = f" ({status['reason']})" if status.get("reason") else ""
    lines.append(f"{'Phase':<16}{phase}{reason}")
    if status.get("message"):
        lines.append(f"{'':<16}{status['message']}")
    # First after the phase: whether the job learns, and if not, what to change.
    lines.extend(learning_lines(status))
    step = progress.get("display") or (str(progress["step"]) if "step" in progress else "-")
    timing = ""
    if progress.get("stepDurationSeconds") is not None:
        timing = (
            f"   {progress['stepDurationSeconds']:.1f}s/step, last step {age(progress.get('lastStepTime'), now)}"
            f"{eta(status)}"
        )
    lines.append(f"{'Step':<16}{step}{timing}")
    lines.extend(cost_lines(status))
    lines.extend(gpu_hours_lines(status, report.get("budgetGpuHours")))
    lines.extend(spend_lines(status, report.get("budgetAmount")))
    trend = report.get("trend") or {}
    if trend.get("steps"):
        lines.append(trend_line("Reward", trend["reward"], number))
        lines.append(trend_line("Format failures", trend["formatFailureRatio"], percent))
        # Validation runs every few steps only: its points side by side, not spread out with gaps.
        lines.append(trend_line("Validation", [v for v in trend["validation"] if v is not None], number))
    else:
        lines.append(f"{'Reward':<16}{number(rewards.get('mean'))} (std {number(rewards.get('std'))})")
        lines.append(f"{'Format failures':<16}{percent(rewards.get('formatFailureRatio'))}")
        if rewards.get("validationMean") is not None:
            lines.append(
                f"{'Validation':<16}{number(rewards['validationMean'])} at step {rewards.get('validationStep')}"
            )
        if report.get("trendUnavailable"):
            lines.append(f"{'':<16}(no trend: {report['trendUnavailable']})")
    episodes = status.get("episodes")
    if isinstance(episodes, dict) and episodes.get("count"):
        lines.append(
            f"{'Episodes':<16}{_count(episodes.get('count'))} last step, {number(episodes.get('turnsMean'), 2)} turns and "
            f"{number(episodes.get('tokensMean'), 1)} tokens each; environment failed "
            f"{percent(episodes.get('environmentErrorRatio'))}, truncated {percent(episodes.get('truncatedRatio'))}, "
            f"malformed tool calls {percent(episodes.get('formatFailureRatio'))}"
        )
    served = status.get("servedModel")
    replicas = _count(served.get("replicas")) if isinstance(served, dict) else None
    serving = _count(served.get("replicasServing")) if isinstance(served, dict) else None
    if replicas and serving is not None:
        lines.append(f"{'vLLM replicas':<16}{serving} of {replicas} serving the trained weights")
    staleness = status.get("staleness")
    if isinstance(staleness, dict) and staleness.get("last") is not None:
        lines.append(
            f"{'Staleness':<16}{staleness['last']} step(s) (maxStaleness {staleness.get('maxStaleness', '-')}), "
            f"sampling overlapped {percent(staleness.get('overlapRatio'))} of the last step, "
            f"{staleness.get('groupsDropped') or 0} group(s) dropped"
        )
    if checkpoint.get("lastStep") is not None:
        lines.append(
            f"{'Checkpoint':<16}step {checkpoint['lastStep']}  {checkpoint.get('path', '')}  "
            f"({age(checkpoint.get('time'), now)})"
        )
    else:
        lines.append(f"{'Checkpoint':<16}none yet")
    lines.append(f"{'Restarts':<16}{status.get('restarts') or 0}")
    for event in report.get("restartEvents") or []:
        lines.append(f"  {event['time'] or '-'}  {event['reason']}: {event['message']}")
    waiting = report.get("waiting") or []
    if waiting:
        lines.append("Waiting on")
        for item in waiting:
            lines.append(f"  {item}")
    conditions = status.get("conditions") or []
    if conditions:
        lines.append("Conditions")
        rows = [
            [c.get("type", ""), c.get("status", ""), c.get("reason") or "", c.get("message") or ""]
            for c in conditions
        ]
        lines.append(textwrap.indent(table(["TYPE", "STATUS", "REASON", "MESSAGE"], rows), "  "))
    return "\n".join(lines)


def clip(text: str, limit: int = TEXT_LIMIT) -> str:
    """At most ``limit`` characters of ``text``, and how many bytes were left out."""
    if len(text) <= limit:
        return text
    dropped = len(text[limit:].encode("utf-8", errors="replace"))
    return f"{text[:limit]}… [truncated {dropped} bytes]"


def wrap(line: str, width: int) -> list[str]:
    """``line`` in pieces of at most ``width`` characters, broken after a space where there is one
    near the end of a piece. Linear in the line's length (textwrap is quadratic on a long word)."""
    pieces: list[str] = []
    start, n = 0, len(line)
    while n - start > width:
        end = start + width
        space = line.rfind(" ", start + width // 2, end)
        cut = space + 1 if space >= 0 else end
        pieces.append(line[start:cut].rstrip(" "))
        start = cut
    pieces.append(line[start:])
    return pieces


def _block(text: Any, width: int, prefix: str) -> str:
    out: list[str] = []
    for para in clip(text if isinstance(text, str) else str(text)).splitlines() or [""]:
        out.extend(wrap(para, max(8, width - len(prefix))))
    return "\n".join(prefix + line for line in out)


def sample_head(sample: dict[str, Any]) -> str:
    reward = as_float(sample.get("reward"))
    parts = [f"reward {reward:+.4f}" if reward is not None else "reward - (not scored)"]
    advantage = as_float(sample.get("advantage"))
    if advantage is not None:
        parts.append(f"advantage {advantage:+.3f}")
    if sample.get("formatFailure"):
        parts.append("FORMAT FAILURE")
    if sample.get("finishReason") == "length":
        parts.append("TRUNCATED")
    components = component_values(sample.get("components"))
    if components:
        parts.append("(" + ", ".join(f"{name} {value:+.3g}" for name, value in components.items()) + ")")
    return "  ".join(parts)


def component_values(value: Any) -> dict[str, float]:
    """A sample's reward components, well-formed names with finite values only (the trainer image wrote
    them), at most MAX_REWARD_COMPONENTS."""
    if not isinstance(value, dict):
        return {}
    found: dict[str, float] = {}
    for name, number in value.items():
        number = as_float(number)
        if isinstance(name, str) and re.fullmatch(COMPONENT_NAME_PATTERN, name) and number is not None:
            found[name] = number
        if len(found) == MAX_REWARD_COMPONENTS:
            break
    return found


def group_head(group: Sequence[dict[str, Any]], noun: str = "completions") -> str:
    """One line over a group's completions (or episodes): how many, their mean and std, and whether all
    tied (a group whose rewards are all equal gives GRPO no signal)."""
    rewards = [r for r in (as_float(s.get("reward")) for s in group) if r is not None]
    if not rewards:
        return f"GROUP  {len(group)} {noun}, none scored"
    mean = sum(rewards) / len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
    tied = "  TIED (no signal)" if len(rewards) > 1 and max(rewards) == min(rewards) else ""
    return f"GROUP  {len(group)} {noun}  mean {mean:+.4f}  std {std:.4f}{tied}"


def samples_text(samples: Sequence[dict[str, Any]], width: int = 100) -> str:
    """Samples grouped under their prompt (a GRPO group shares one prompt), each completion indented
    under a line with its reward, so a reward can be read next to the text that earned it."""
    lines: list[str] = []
    groups: list[list[dict[str, Any]]] = []
    key: tuple[Any, Any, Any] | None = None
    for sample in samples:
        this = (sample.get("step"), sample.get("split"), sample.get("prompt"))
        if this != key:
            key = this
            groups.append([])
        groups[-1].append(sample)
    for group in groups:
        first = group[0]
        if lines:
            lines.append("")
        lines.append(f"── step {first.get('step')} · {first.get('split', 'train')} ──")
        lines.append("PROMPT")
        lines.append(_block(first.get("prompt", ""), width, "  │ "))
        if first.get("answer") is not None:
            lines.append("REFERENCE ANSWER")
            lines.append(_block(first.get("answer"), width, "  │ "))
        lines.append(group_head(group))
        for sample in group:
            lines.append(f"  {sample_head(sample)}")
            lines.append(_block(sample.get("completion", ""), width, "    │ "))
    return "\n".join(lines)


def component_names(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The reward components the rows carry, first seen first: only well-formed names (the metric protocol's
    rule), at most MAX_REWARD_COMPONENTS, since metrics.jsonl is written by the tenant's trainer image and its
    keys reach the terminal."""
    names: list[str] = []
    for row in rows:
        parts = row.get("reward_components")
        if not isinstance(parts, dict):
            continue
        for name in parts:
            if (
                isinstance(name, str)
                and name not in names
                and len(names) < MAX_REWARD_COMPONENTS
                and re.fullmatch(COMPONENT_NAME_PATTERN, name)
            ):
                names.append(name)
    return names


# `kubectl grpo rewards --columns`: name -> (header, metrics.jsonl field, how it is shown). The default
# columns come first; a reward component is a column under its own name.
REWARD_COLUMNS: dict[str, tuple[str, str, Callable[[Any], str]]] = {
    "reward": ("REWARD", "reward_mean", number),
    "std": ("STD", "reward_std", number),
    "format-fail": ("FORMAT-FAIL", "format_failure_ratio", percent),
    "no-signal": ("NO-SIGNAL", "zero_std_group_ratio", percent),
    # Completions cut off at maxCompletionLength: a share that grows means the limit shapes learning.
    "truncated": ("TRUNCATED", "truncated_ratio", percent),
    "validation": ("VALIDATION", "validation_mean", lambda v: number(v) if v is not None else ""),
    "kl": ("KL", "kl", lambda v: number(v, 5)),
    "entropy": ("ENTROPY", "entropy", number),
    "length": ("LENGTH", "completion_length", lambda v: number(v, 1)),
    "clip": ("CLIP", "clip_ratio", percent),
    "lr": ("LR", "learning_rate", lambda v: f"{as_float(v):.2e}" if as_float(v) is not None else "-"),
    "loss": ("LOSS", "loss", number),
    "metric-errors": ("METRIC-ERR", "metric_error_ratio", percent),
    "seconds": ("SECONDS", "step_seconds", lambda v: number(v, 1)),
    "health": ("HEALTH", "learning_health", lambda v: str(v) if isinstance(v, str) and v.isalpha() else "-"),
}
DEFAULT_REWARD_COLUMNS = ("reward", "std", "format-fail", "no-signal", "truncated", "validation")


def reward_columns(wanted: str | None, rows: Sequence[dict[str, Any]]) -> list[str]:
    """The columns of ``--columns a,b,c`` (None: the defaults and every reward component), checked."""
    components = component_names(rows)
    if wanted is None:
        return [*DEFAULT_REWARD_COLUMNS, *components]
    names = [name.strip() for name in wanted.split(",") if name.strip()]
    unknown = [n for n in names if n not in REWARD_COLUMNS and n not in components]
    if unknown or not names:
        known = ", ".join([*REWARD_COLUMNS, *components])
        raise ValueError(f"unknown column {', '.join(unknown) or '(none given)'}: choose from {known}")
    return names


def reward_cells(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """The header and one line of cells per row of the rewards table."""
    header, body = ["STEP"], [[str(step_of(r)) if step_of(r) is not None else "-"] for r in rows]
    for name in columns:
        if name in REWARD_COLUMNS:
            title, key, show = REWARD_COLUMNS[name]
            header.append(title)
            for line, r in zip(body, rows, strict=True):
                line.append(show(r.get(key)))
        else:  # a named part of the reward (the metric's components): which part moves
            header.append(name.upper())
            for line, r in zip(body, rows, strict=True):
                line.append(_component(r, name))
    return header, body


def rewards_text(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    chosen = list(columns) if columns is not None else reward_columns(None, rows)
    text = table(*reward_cells(rows, chosen))
    return f"{text}\n\nreward  {sparkline([as_float(r.get('reward_mean')) for r in rows])}"


# Width of each column of `rewards --follow`, whose lines are printed before the later ones are known.
FOLLOW_COLUMN_WIDTH = 10


def follow_lines(rows: Sequence[dict[str, Any]], columns: Sequence[str], header: bool) -> list[str]:
    """Lines of the rewards table at fixed widths, so lines printed step by step stay aligned."""
    head, body = reward_cells(rows, columns)
    widths = [max(len(h), FOLLOW_COLUMN_WIDTH) for h in head]
    lines = [head, *body] if header else body
    return ["   ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines]


def _component(row: dict[str, Any], name: str) -> str:
    parts = row.get("reward_components")
    return number(parts.get(name)) if isinstance(parts, dict) and name in parts else ""


def checkpoints_text(items: Sequence[dict[str, Any]], model: str | None) -> str:
    rows = [[str(c["step"]), "*" if c["latest"] else "", c["path"]] for c in items]
    text = table(["STEP", "LATEST", "PATH"], rows) if rows else "No checkpoints published yet."
    final = f"Final model: {model}" if model else "Final model: not written yet (training has not finished)"
    return f"{text}\n{final}"


def _count(value: object) -> int | None:
    """A count from the status (written by the trainer, so checked): a non-negative int, else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
