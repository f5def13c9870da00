"""The panels of the chart's Grafana dashboard, declared compactly: rows of panels, each a list of PromQL
targets. hack/helm/dashboard.py renders them to Grafana's JSON model; tests/helm/ reads every query."""

from __future__ import annotations

from dataclasses import dataclass, field

# Label matchers of every per-job query; the vLLM series get `grpojob` from the PodMonitor relabeling.
JOB = 'namespace=~"$namespace", grpojob=~"$grpojob"'
BY = "namespace, grpojob"
LEGEND = "{{namespace}}/{{grpojob}}"
RATE = "$__rate_interval"


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = LEGEND


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    targets: tuple[Target, ...]
    unit: str = "short"
    kind: str = "timeseries"  # or "stat", or "state-timeline" (coloured by thresholds)
    width: int = 8
    min: float | None = None
    max: float | None = None
    # (value, colour) steps after the base green, matching the alert thresholds where there is one.
    thresholds: tuple[tuple[float, str], ...] = ()
    # (value, text) pairs: Grafana shows the text for the value (e.g. in a state timeline's tooltip).
    mappings: tuple[tuple[float, str], ...] = ()


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)


def ratio(numerator: str, denominator: str) -> str:
    """Ratio of two counters' rates, per job: aggregatable, unlike an average of per-step ratios."""
    return (
        f"sum by ({BY}) (rate({numerator}{{{JOB}}}[{RATE}]))\n"
        f"/\nsum by ({BY}) (rate({denominator}{{{JOB}}}[{RATE}]))"
    )


def gauge(metric: str) -> str:
    return f"max by ({BY}) ({metric}{{{JOB}}})"


ROWS: tuple[Row, ...] = (
    Row(
        "Progress",
        (
            Panel(
                "Step",
                "Last completed optimizer step (grpo_step) of each job.",
                (Target(gauge("grpo_step")),),
                kind="stat",
                width=6,
            ),
            Panel(
                "Progress",
                "Steps done out of S (grpo_step / grpo_total_steps).",
                (Target(f"{gauge('grpo_step')}\n/\n{gauge('grpo_total_steps')}"),),
                unit="percentunit",
                kind="stat",
                width=6,
                min=0,
                max=1,
            ),
            Panel(
                "Time since last step",
                "Seconds since the last completed step; GRPOJobTrainingStalled fires past its threshold.",
                (Target(f"time() - max by ({BY}) (grpo_last_step_timestamp_seconds{{{JOB}}} > 0)"),),
                unit="s",
                kind="stat",
                width=6,
                thresholds=((900, "yellow"), (1800, "red")),
            ),
            Panel(
                "Checkpoint age",
                "Seconds since the newest published checkpoint (a restart resumes from it).",
                (Target(f"time() - max by ({BY}) (grpo_last_checkpoint_timestamp_seconds{{{JOB}}} > 0)"),),
                unit="s",
                kind="stat",
                width=6,
                thresholds=((3600, "yellow"), (7200, "red")),
            ),
        ),
    ),
    Row(
        "Learning signal",
        (
            Panel(
                "Learning health",
                "Trainer rank 0's learning-health diagnosis over its last steps (grpo_learning_health == 1): "
                "one row per job and reason, green while the reason is Healthy or Solved, red while it says "
                "the job is not learning (RewardFlat, NoSignal, KLRunaway, EntropyCollapse, ...). A job's "
                "rightmost bar is its current diagnosis; `kubectl grpo status JOB` prints it with the setting "
                "to change, and GRPOJobNotLearning fires once a red reason holds for an hour.",
                (
                    Target(
                        f'2 * max by ({BY}, reason) (grpo_learning_health{{{JOB}, healthy="false"}} == 1)\n'
                        f"or\nmax by ({BY}, reason) (grpo_learning_health{{{JOB}}} == 1)",
                        "{{namespace}}/{{grpojob}} {{reason}}",
                    ),
                ),
                kind="state-timeline",
                width=12,
                min=1,
                max=2,
                thresholds=((2, "red"),),
                mappings=((1, "healthy"), (2, "not learning")),
            ),
            Panel(
                "Reward mean and std",
                "Mean and population std of the last step's training rewards (metric errors excluded).",
                (
                    Target(gauge("grpo_reward_mean"), "mean {{namespace}}/{{grpojob}}"),
                    Target(gauge("grpo_reward_std"), "std {{namespace}}/{{grpojob}}"),
                ),
                width=12,
            ),
            Panel(
                "Validation reward",
                "Mean reward on the validation set, scored every spec.grpo.validation.everySteps steps. "
                "Training reward rising while this falls is reward hacking.",
                (Target(gauge("grpo_validation_reward_mean")),),
                width=12,
            ),
            Panel(
                "Reward components",
                "Mean of each named reward component the metric answers (e.g. accuracy and format), whose "
                "sum, or weighted sum under spec.metric.rewardWeights, is the reward: which part of the reward "
                "moves. Empty for a metric that answers a single number.",
                (
                    Target(
                        f"max by ({BY}, component) (grpo_reward_component_mean{{{JOB}}})",
                        "{{component}} {{namespace}}/{{grpojob}}",
                    ),
                ),
                width=12,
            ),
            Panel(
                "Zero-std group ratio",
                "Fraction of groups whose G rewards were all equal: advantage 0, no learning signal.",
                (
                    Target(ratio("grpo_zero_std_groups_total", "grpo_groups_total")),
                    Target(gauge("grpo_zero_std_group_ratio"), "last step {{namespace}}/{{grpojob}}"),
                ),
                unit="percentunit",
                min=0,
                max=1,
                thresholds=((0.9, "red"),),
            ),
            Panel(
                "Format-failure ratio",
                "Fraction of completions the metric could not parse (scored formatFailureScore).",
                (Target(ratio("grpo_format_failures_total", "grpo_rollouts_total")),),
                unit="percentunit",
                min=0,
                max=1,
                thresholds=((0.5, "red"),),
            ),
            Panel(
                "Metric-error ratio",
                "Fraction of completions the metric service failed to score (left out, advantage 0).",
                (Target(ratio("grpo_metric_errors_total", "grpo_rollouts_total")),),
                unit="percentunit",
                min=0,
                max=1,
                thresholds=((0.02, "red"),),
            ),
            Panel(
                "Weights changed per step",
                "Fraction of a fixed sample of the trainable weight elements that the last optimizer step "
                "changed at all. Near 1 while the (fp32 master) weights train; below 1 % for 3 steps the updates "
                "vanish (condition UpdatesEffective False, event UpdatesVanishing): a learning rate too small, no "
                "gradient at all (every group tied, every completion masked), or a trainer image that holds "
                "16-bit weights.",
                (Target(gauge("grpo_updated_parameter_fraction")),),
                unit="percentunit",
                width=12,
                min=0,
                max=1,
            ),
            Panel(
                "Update-to-weight ratio",
                "||w_after - w_before|| / ||w_after|| of the sampled weights in the last optimizer step: with "
                "Adam about the learning rate over the weights' size; under 1e-8 the steps change nothing that "
                "matters.",
                (Target(gauge("grpo_update_to_weight_ratio")),),
                unit="sci",
                width=12,
                min=0,
            ),
        ),
    ),
    Row(
        "Policy",
        (
            Panel(
                "KL to the reference model",
                "Mean KL divergence of the policy from the reference model (0 when beta = 0).",
                (Target(gauge("grpo_kl")),),
            ),
            Panel(
                "Clip ratio",
                "Fraction of tokens whose importance ratio was clipped: in all, at 1 - epsilon (negative "
                "advantages) and at 1 + epsilonHigh (positive advantages).",
                (
                    Target(gauge("grpo_clip_ratio")),
                    Target(gauge("grpo_clip_ratio_low"), "low {{namespace}}/{{grpojob}}"),
                    Target(gauge("grpo_clip_ratio_high"), "high {{namespace}}/{{grpojob}}"),
                ),
                unit="percentunit",
                min=0,
            ),
            Panel(
                "Completion length",
                "Mean completion length of the last step, in tokens.",
                (Target(gauge("grpo_completion_length_tokens")),),
            ),
            Panel(
                "Entropy",
                "Mean per-token entropy of the policy on its completions (nats); a steady fall toward 0 "
                "means the G answers of a group stop differing.",
                (Target(gauge("grpo_entropy")),),
                min=0,
            ),
            Panel(
                "Truncated completions",
                "Fraction of completions cut off at maxCompletionLength (no end token); the metric sees "
                "them with finishReason length.",
                (Target(gauge("grpo_truncated_completion_ratio")),),
                unit="percentunit",
                min=0,
                max=1,
            ),
            Panel(
                "Importance-sampling ratio (vLLM correction)",
                "Trainer/vLLM probability ratio of the sampled tokens: mean, min and max, and the share of "
                "tokens masked out of the loss (mask modes). All 0 while the correction is off.",
                (
                    Target(gauge("grpo_importance_sampling_ratio_mean"), "mean {{namespace}}/{{grpojob}}"),
                    Target(gauge("grpo_importance_sampling_ratio_min"), "min {{namespace}}/{{grpojob}}"),
                    Target(gauge("grpo_importance_sampling_ratio_max"), "max {{namespace}}/{{grpojob}}"),
                    Target(
                        gauge("grpo_importance_sampling_masked_ratio"), "masked {{namespace}}/{{grpojob}}"
                    ),
                ),
            ),
            Panel(
                "Asynchronous generation (maxStaleness)",
                "Staleness of the trained groups (mean, optimizer steps), the share of each step in which "
                "vLLM sampled later groups while the trainer trained, and groups dropped per minute. Staleness "
                "and overlap stay 0 in synchronous jobs.",
                (
                    Target(
                        f"sum by ({BY}) (rate(grpo_rollout_staleness_steps_sum{{{JOB}}}[{RATE}]))\n/\n"
                        f"sum by ({BY}) (rate(grpo_rollout_staleness_steps_count{{{JOB}}}[{RATE}]))",
                        "staleness {{namespace}}/{{grpojob}}",
                    ),
                    Target(gauge("grpo_generation_overlap_ratio"), "overlap {{namespace}}/{{grpojob}}"),
                    Target(
                        f"sum by ({BY}) (rate(grpo_rollout_groups_dropped_total{{{JOB}}}[{RATE}])) * 60",
                        "dropped/min {{namespace}}/{{grpojob}}",
                    ),
                ),
                min=0,
            ),
        ),
    ),
    Row(
        "Episodes (spec.environment)",
        (
            Panel(
                "Episode outcomes",
                "Environment jobs: share of episodes by how they ended: done (the environment ended them), "
                "truncated (maxTurns or the token budget), format_failure (a malformed tool call), "
                "environment_error (the environment failed them: unscored, against errorBudget).",
                tuple(
                    Target(
                        f'sum by ({BY}) (rate(grpo_episodes_total{{{JOB}, outcome="{outcome}"}}[{RATE}]))\n/\n'
                        f"sum by ({BY}) (rate(grpo_episodes_total{{{JOB}}}[{RATE}]))",
                        f"{outcome} {{{{namespace}}}}/{{{{grpojob}}}}",
                    )
                    for outcome in ("done", "truncated", "format_failure", "environment_error")
                ),
                unit="percentunit",
                min=0,
                max=1,
            ),
            Panel(
                "Turns and tokens per episode",
                "Environment jobs: model turns per episode, and tokens per episode by source (model: sampled "
                "and trained; environment: observations and template glue, masked out of the loss).",
                (
                    Target(
                        ratio("grpo_episode_turns_total", "grpo_episodes_total"),
                        "turns {{namespace}}/{{grpojob}}",
                    ),
                    *(
                        Target(
                            f'sum by ({BY}) (rate(grpo_episode_tokens_total{{{JOB}, source="{source}"}}[{RATE}]))'
                            f"\n/\nsum by ({BY}) (rate(grpo_episodes_total{{{JOB}}}[{RATE}]))",
                            f"{source} tokens {{{{namespace}}}}/{{{{grpojob}}}}",
                        )
                        for source in ("model", "environment")
                    ),
                ),
                min=0,
            ),
            Panel(
                "Environment step latency",
                "Environment jobs: median and 95th percentile of one environment step, as the trainer "
                "measured it (timeoutSeconds is where a step fails).",
                (
                    Target(
                        f"histogram_quantile(0.5, sum by ({BY}, le) "
                        f"(rate(grpo_environment_step_seconds_bucket{{{JOB}}}[{RATE}])))",
                        "p50 {{namespace}}/{{grpojob}}",
                    ),
                    Target(
                        f"histogram_quantile(0.95, sum by ({BY}, le) "
                        f"(rate(grpo_environment_step_seconds_bucket{{{JOB}}}[{RATE}])))",
                        "p95 {{namespace}}/{{grpojob}}",
                    ),
                ),
                unit="s",
                min=0,
            ),
        ),
    ),
    Row(
        "Throughput",
        (
            Panel(
                "Step rate",
                "Optimizer steps per second.",
                (Target(f"sum by ({BY}) (rate(grpo_step_duration_seconds_count{{{JOB}}}[{RATE}]))"),),
                unit="ops",
                width=6,
            ),
            Panel(
                "Step duration",
                "Wall time of a step, generation and scoring included: mean and 90th percentile.",
                (
                    Target(
                        f"sum by ({BY}) (rate(grpo_step_duration_seconds_sum{{{JOB}}}[{RATE}]))\n/\n"
                        f"sum by ({BY}) (rate(grpo_step_duration_seconds_count{{{JOB}}}[{RATE}]))",
                        "mean {{namespace}}/{{grpojob}}",
                    ),
                    Target(
                        f"histogram_quantile(0.9, sum by ({BY}, le) "
                        f"(rate(grpo_step_duration_seconds_bucket{{{JOB}}}[{RATE}])))",
                        "p90 {{namespace}}/{{grpojob}}",
                    ),
                ),
                unit="s",
                width=6,
            ),
            Panel(
                "Rollouts per second",
                "Completions generated and scored per second (B*G per step).",
                (Target(f"sum by ({BY}) (rate(grpo_rollouts_total{{{JOB}}}[{RATE}]))"),),
                unit="ops",
                width=6,
            ),
            Panel(
                "Tokens per second",
                "Prompt plus completion tokens processed per second in training.",
                (Target(f"sum by ({BY}) (rate(grpo_tokens_total{{{JOB}}}[{RATE}]))"),),
                unit="ops",
                width=6,
            ),
            Panel(
                "Share of step time waiting for the metric service",
                "Seconds spent waiting for the metric service per second of step time.",
                (Target(ratio("grpo_metric_score_seconds_total", "grpo_step_duration_seconds_sum")),),
                unit="percentunit",
                width=12,
                min=0,
            ),
            Panel(
                "Training loss",
                "Loss of the last step. Often near 0 in GRPO by construction: not a progress signal.",
                (Target(gauge("grpo_loss")),),
                width=12,
            ),
        ),
    ),
    Row(
        "Generation (vLLM)",
        (
            Panel(
                "vLLM requests running and waiting",
                "Requests in the vLLM scheduler: a growing waiting queue means generation is the bottleneck.",
                (
                    Target(
                        f"sum by ({BY}) (vllm:num_requests_running{{{JOB}}})",
                        "running {{namespace}}/{{grpojob}}",
                    ),
                    Target(
                        f"sum by ({BY}) (vllm:num_requests_waiting{{{JOB}}})",
                        "waiting {{namespace}}/{{grpojob}}",
                    ),
                ),
                width=6,
            ),
            Panel(
                "vLLM KV-cache usage",
                "Fraction of the KV cache in use (vLLM names it _perc but exports 0-1).",
                (Target(f"max by ({BY}) (vllm:kv_cache_usage_perc{{{JOB}}})"),),
                unit="percentunit",
                width=6,
                min=0,
                max=1,
                thresholds=((0.8, "yellow"), (0.95, "red")),
            ),
            Panel(
                "vLLM tokens per second",
                "Prompt and generated tokens per second across the job's vLLM servers.",
                (
                    Target(
                        f"sum by ({BY}) (rate(vllm:generation_tokens_total{{{JOB}}}[{RATE}]))",
                        "generated {{namespace}}/{{grpojob}}",
                    ),
                    Target(
                        f"sum by ({BY}) (rate(vllm:prompt_tokens_total{{{JOB}}}[{RATE}]))",
                        "prompt {{namespace}}/{{grpojob}}",
                    ),
                ),
                unit="ops",
                width=6,
            ),
            Panel(
                "vLLM preemptions",
                "Sequences preempted per second for lack of KV-cache space.",
                (Target(f"sum by ({BY}) (rate(vllm:num_preemptions_total{{{JOB}}}[{RATE}]))"),),
                unit="ops",
                width=6,
            ),
        ),
    ),
    Row(
        "Spend",
        (
            Panel(
                "Spend per namespace, dashboard range",
                "What each namespace's jobs spent over the dashboard's time range at the platform's prices "
                "(Helm pricing; empty without prices), deleted jobs included.",
                (
                    Target(
                        "sum by (namespace, currency) (increase(grpo_operator_job_spend_total"
                        '{namespace=~"$namespace"}[$__range]))',
                        "{{namespace}} {{currency}}",
                    ),
                ),
                kind="stat",
                width=8,
            ),
            Panel(
                "Spend per job",
                "Each job's cost so far (grpo_operator_job_spend_total) and its amount budget, where it has one.",
                (
                    Target(f"max by ({BY}, currency) (grpo_operator_job_spend_total{{{JOB}}})"),
                    Target(
                        f"max by ({BY}, currency) (grpo_operator_job_budget_amount{{{JOB}}})",
                        "{{namespace}}/{{grpojob}} budget",
                    ),
                ),
                width=8,
            ),
            Panel(
                "GPU-hours per job",
                "GPU-hours each job spent, generation and training (status.cost), against its GPU-hour budget "
                "(spec.budget.gpuHours or the platform's namespace budget).",
                (
                    Target(f"sum by ({BY}) (grpo_operator_job_gpu_seconds_total{{{JOB}}}) / 3600"),
                    Target(
                        f"max by ({BY}) (grpo_operator_job_budget_gpu_seconds{{{JOB}}}) / 3600",
                        "{{namespace}}/{{grpojob}} budget",
                    ),
                ),
                width=8,
            ),
        ),
    ),
    Row(
        "Operator",
        (
            Panel(
                "Reconciles by result",
                "Reconciles per second: success, conflict (retried at once), error (retried with backoff), "
                "gone (job deleted).",
                (
                    Target(
                        f"sum by (result) (rate(grpo_operator_reconcile_total[{RATE}]))",
                        "{{result}}",
                    ),
                ),
                unit="ops",
                width=6,
            ),
            Panel(
                "Reconcile duration",
                "Time to observe a job, decide and carry out the plan: 50th and 99th percentile.",
                (
                    Target(
                        "histogram_quantile(0.5, sum by (le) "
                        f"(rate(grpo_operator_reconcile_duration_seconds_bucket[{RATE}])))",
                        "p50",
                    ),
                    Target(
                        "histogram_quantile(0.99, sum by (le) "
                        f"(rate(grpo_operator_reconcile_duration_seconds_bucket[{RATE}])))",
                        "p99",
                    ),
                ),
                unit="s",
                width=6,
            ),
            Panel(
                "Jobs by phase",
                "GRPOJobs the operator knows, by phase.",
                (Target("sum by (phase) (grpo_operator_jobs)", "{{phase}}"),),
                width=6,
            ),
            Panel(
                "Work queue depth",
                "Jobs waiting for a reconcile worker.",
                (Target("max(grpo_operator_workqueue_depth)", "depth"),),
                width=6,
            ),
            Panel(
                "Gang restarts",
                "Trainer gang restarts per job and reason since the operator started; counted=true ones "
                "spend the job's backoffLimit. Shown as totals: each series appears with its first "
                "restart, which increase() would miss.",
                (
                    Target(
                        f"sum by ({BY}, reason, counted) (grpo_operator_gang_restarts_total{{{JOB}}})",
                        "{{namespace}}/{{grpojob}} {{reason}} counted={{counted}}",
                    ),
                ),
                width=8,
            ),
            Panel(
                "Kubernetes API errors",
                "Failed API requests of the reconcile loop per second, by verb, kind and HTTP status.",
                (
                    Target(
                        f"sum by (verb, kind, code) (rate(grpo_operator_api_errors_total[{RATE}]))",
                        "{{verb}} {{kind}} {{code}}",
                    ),
                ),
                unit="ops",
                width=8,
            ),
            Panel(
                "Events posted",
                "Kubernetes events the operator posted on GRPOJobs since it started, by type and reason.",
                (Target("sum by (type, reason) (grpo_operator_events_total)", "{{type}} {{reason}}"),),
                width=8,
            ),
        ),
    ),
)
