"""bench/scale.py's figures of one size, and the tables it prints of them."""

from __future__ import annotations

from dataclasses import dataclass, field

from _scale_timelines import STAGES


@dataclass
class SizeResult:
    jobs: int
    schedulable_jobs: int
    child_objects: int
    floor_create_s: float
    floor_running_s: float
    operator_running_s: float
    apply_s: float
    ratio: float
    ratio_to_create: float
    p50_s: float
    p95_s: float
    max_s: float
    operator_requests: float
    operator_requests_per_job: float
    all_requests_per_job: float
    floor_requests_per_job: float
    idle_seconds: float
    idle_operator_requests_per_min: float
    operator_cpu_s: float
    operator_cpu_s_per_job: float
    idle_operator_cpu_s_per_min: float
    operator_peak_rss_mib: float
    machine_busy_fraction: float
    load_avg_start: float
    load_avg_end: float
    reconcile_total: float
    # reconciles from the apply until every job settled (the operator's own counter), per job; without
    # those of jobs already gone (the floor's children, deleted meanwhile, each wake their job's key)
    ramp_reconciles_per_job: float
    # stage -> (p50, p95) seconds since the job was applied, and (p50, p95) of the stage alone
    timeline: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)
    # the operator's own request counter, "verb resource" -> requests per job (ramp) / in the idle window
    ramp_requests_per_job_by_kind: dict[str, float] = field(default_factory=dict)
    idle_requests_by_kind: dict[str, float] = field(default_factory=dict)
    # after every job is Running: requests per job until the operator went quiet, and how long that took
    settling_requests_per_job_by_kind: dict[str, float] = field(default_factory=dict)
    quiet_after_s: float = float("nan")
    # the operator's Events until every job settled, "type reason" -> events per job
    events_per_job_by_reason: dict[str, float] = field(default_factory=dict)
    kueue: bool = False
    admitted_p50_s: float = float("nan")
    admitted_p95_s: float = float("nan")


def timeline_report(results: list[SizeResult]) -> str:
    width = max(len(stage) for stage, _ in STAGES) + 2
    lines = [
        "time since apply, p50 / p95, and the stage alone, p50 / p95 (seconds; API server timestamps, 1 s resolution)",
        f"{'':{width}}" + "".join(f"{str(r.jobs) + ' jobs':>26}" for r in results),
    ]
    for stage, _ in STAGES:
        cells = []
        for r in results:
            row = r.timeline.get(stage)
            cells.append(f"{row[0]:5.1f}/{row[1]:5.1f} +{row[2]:4.1f}/{row[3]:4.1f}" if row else "n/a")
        lines.append(f"{stage:{width}}" + "".join(f"{c:>26}" for c in cells))
    return "\n".join(lines)


def requests_report(results: list[SizeResult]) -> str:
    """Where the operator's requests go, by its own counter: per job during the ramp, and in the idle window."""
    lines = [
        "operator requests by verb and resource (its own counter): per job until all Running (ramp) | per job "
        "from then until quiet (settling) | in the idle window"
    ]
    for r in results:
        ramp = ", ".join(f"{k} {v:.2f}" for k, v in r.ramp_requests_per_job_by_kind.items()) or "none"
        settling = ", ".join(f"{k} {v:.2f}" for k, v in r.settling_requests_per_job_by_kind.items()) or "none"
        idle = ", ".join(f"{k} {v:.0f}" for k, v in r.idle_requests_by_kind.items()) or "none"
        lines.append(
            f"{r.jobs:>5} jobs: {ramp} | settling ({r.quiet_after_s:.0f}s): {settling} | "
            f"idle {r.idle_seconds:.0f}s: {idle}"
        )
    lines.append("of which Events, per job until quiet, by type and reason (grpo_operator_events_total)")
    for r in results:
        events = ", ".join(f"{k} {v:.2f}" for k, v in r.events_per_job_by_reason.items()) or "none"
        lines.append(f"{r.jobs:>5} jobs: {events}")
    return "\n".join(lines)


ROWS: list[tuple[str, str, str]] = [
    ("jobs (schedulable)", "jobs", "{r.jobs} ({r.schedulable_jobs})"),
    ("child objects created", "child_objects", "{r.child_objects}"),
    ("(a) floor: kubectl create", "floor_create_s", "{r.floor_create_s:.1f} s"),
    ("(a) floor: create -> all Running", "floor_running_s", "{r.floor_running_s:.1f} s"),
    ("(b) operator: apply -> all Running", "operator_running_s", "{r.operator_running_s:.1f} s"),
    ("    of which kubectl apply", "apply_s", "{r.apply_s:.1f} s"),
    ("b/a (a = create -> Running)", "ratio", "{r.ratio:.2f}"),
    ("b/a (a = kubectl create only)", "ratio_to_create", "{r.ratio_to_create:.2f}"),
    ("through Kueue", "kueue", "{r.kueue}"),
    ("time to Kueue admission p50", "admitted_p50_s", "{r.admitted_p50_s:.1f} s"),
    ("time to Kueue admission p95", "admitted_p95_s", "{r.admitted_p95_s:.1f} s"),
    ("time to Running p50", "p50_s", "{r.p50_s:.1f} s"),
    ("time to Running p95", "p95_s", "{r.p95_s:.1f} s"),
    ("time to Running max", "max_s", "{r.max_s:.1f} s"),
    ("operator API requests / job", "operator_requests_per_job", "{r.operator_requests_per_job:.1f}"),
    ("all clients' requests / job", "all_requests_per_job", "{r.all_requests_per_job:.1f}"),
    ("  (floor: all clients / job)", "floor_requests_per_job", "{r.floor_requests_per_job:.1f}"),
    (
        "operator idle requests / min",
        "idle_operator_requests_per_min",
        "{r.idle_operator_requests_per_min:.1f}",
    ),
    ("operator CPU s (ramp)", "operator_cpu_s", "{r.operator_cpu_s:.1f}"),
    ("operator CPU s / job", "operator_cpu_s_per_job", "{r.operator_cpu_s_per_job:.3f}"),
    ("operator idle CPU s / min", "idle_operator_cpu_s_per_min", "{r.idle_operator_cpu_s_per_min:.2f}"),
    ("operator peak RSS", "operator_peak_rss_mib", "{r.operator_peak_rss_mib:.0f} MiB"),
    ("reconciles (whole run)", "reconcile_total", "{r.reconcile_total:.0f}"),
    ("reconciles / job (ramp)", "ramp_reconciles_per_job", "{r.ramp_reconciles_per_job:.1f}"),
    ("machine CPU busy during (b)", "machine_busy_fraction", "{r.machine_busy_fraction:.0%}"),
    ("load average start/end of (b)", "load_avg_start", "{r.load_avg_start:.1f}/{r.load_avg_end:.1f}"),
]


def report(results: list[SizeResult]) -> str:
    lines = []
    width = max(len(label) for label, _, _ in ROWS)
    header = f"{'':{width}}  " + "  ".join(f"{r.jobs:>12} jobs" for r in results)
    if len(results) > 1:
        header += f"  {'growth ' + str(results[0].jobs) + '->' + str(results[-1].jobs):>18}"
    lines.append(header)
    for label, attr, fmt in ROWS:
        cells = "  ".join(f"{fmt.format(r=r):>17}" for r in results)
        line = f"{label:{width}}  {cells}"
        if len(results) > 1 and attr not in ("jobs", "machine_busy_fraction", "load_avg_start"):
            first, last = getattr(results[0], attr), getattr(results[-1], attr)
            if first:
                line += f"  {last / first:>17.2f}x"
        lines.append(line)
    return "\n".join(lines)
