"""``kubectl grpo``'s command line: the subcommands, their flags and the help text with its examples
and exit codes."""

from __future__ import annotations

import argparse
import os

from grpo_operator.api.advice import DEFAULT_WARN_ROLLOUTS
from grpo_operator.kubectl_plugin.data import DEFAULT_RECENT_STEPS
from grpo_operator.kubectl_plugin.volume import DEFAULT_READER_IMAGE

PROG = "kubectl grpo"

MAIN_HELP = f"""\
See what a GRPOJob's model writes: status with reward trends, sample completions and their rewards,
per-step rewards (and a PNG), checkpoints, the trained model, logs; suspend and resume.

The job's files are read through a short-lived reader pod that mounts the job's volume read-only
(while the job runs and after it finished). That needs, in the job's namespace: create/get/delete pods
and create pods/exec, which the edit role grants.

Examples:
  {PROG} status qwen-gsm8k -n team-math
  {PROG} samples qwen-gsm8k --worst --limit 5
  {PROG} samples qwen-gsm8k --follow
  {PROG} rewards qwen-gsm8k --plot reward.png
  {PROG} checkpoints qwen-gsm8k -o json
  {PROG} export qwen-gsm8k --to ./qwen-gsm8k-final
  {PROG} logs qwen-gsm8k --role trainer -f
  {PROG} suspend qwen-gsm8k
  {PROG} config qwen-gsm8k   (the resolved spec and trainer.json)
  {PROG} compare qwen-lr1e6 qwen-lr3e6 --plot both.png
  {PROG} check -f job.yaml   (before applying it; no cluster needed)

What the job's trainer wrote is shown with terminal control characters escaped (as \\u001b), and
read in bounded amounts: a record over 1 MiB (an episode over 8 MiB) is skipped and a prompt,
completion or observation shown as text is cut at 64 Ki characters, each with a notice; of a file over 64 MiB only its newest 64 MiB are read.

Exit codes: 0 ok; 1 the request failed (the message says why); 2 bad arguments;
3 not found (job, pod, checkpoint or file); 4 permission missing (the message lists which);
5 a file on the job's volume is malformed or unsafe (the message names it).
"""


def _connection(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection (as for kubectl)")
    group.add_argument("-n", "--namespace", help="namespace of the job (default: the context's namespace)")
    group.add_argument("--context", help="kubeconfig context to use")
    group.add_argument(
        "--kubeconfig", help="path to the kubeconfig file (default: $KUBECONFIG or ~/.kube/config)"
    )


def _output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=("json", "yaml"), help="print data as JSON or YAML")


def _reader_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("reader pod (reads the job's volume)")
    group.add_argument(
        "--reader-image",
        default=os.environ.get("KUBECTL_GRPO_READER_IMAGE", DEFAULT_READER_IMAGE),
        help=f"image with sh, tail, ls and tar (default: $KUBECTL_GRPO_READER_IMAGE or {DEFAULT_READER_IMAGE})",
    )
    group.add_argument(
        "--reader-timeout", type=float, default=120.0, help="seconds to wait for it to start (default 120)"
    )


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog=PROG, description=MAIN_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    subs = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def sub(name: str, help_: str, examples: str) -> argparse.ArgumentParser:
        p = subs.add_parser(
            name,
            help=help_,
            description=help_,
            epilog=f"Examples:\n{examples}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("job", metavar="JOB", help="name of the GRPOJob")
        _connection(p)
        return p

    p = sub(
        "status",
        "Phase, step/S, reward and format-failure trends, last checkpoint, conditions, why pending, restarts.",
        f"  {PROG} status qwen-gsm8k -n team-math\n  {PROG} status qwen-gsm8k -o yaml\n"
        f"  {PROG} status qwen-gsm8k --watch --interval 30",
    )
    _output(p)
    _reader_flags(p)
    p.add_argument("--no-trend", action="store_true", help="skip the trend (no reader pod; status only)")
    p.add_argument(
        "-w",
        "--watch",
        action="store_true",
        help="print the status again every --interval seconds until the job ends",
    )
    p.add_argument(
        "--interval", type=float, default=10.0, help="seconds between reports with --watch (default 10)"
    )

    p = sub(
        "samples",
        "Prompts, completions and their rewards (default: every sample of the newest step); for a job with "
        "spec.environment its episodes: each turn's text, action and observation, which tokens were trained, "
        "and the reward.",
        f"  {PROG} samples qwen-gsm8k\n  {PROG} samples qwen-gsm8k --step 120 --best --limit 3\n"
        f"  {PROG} samples qwen-gsm8k --split validation\n  {PROG} samples qwen-gsm8k --follow\n"
        f"  {PROG} samples calc-agent --worst --limit 1   (a job with spec.environment: its episodes)",
    )
    _output(p)
    _reader_flags(p)
    p.add_argument("--step", type=int, help="only this step")
    order = p.add_mutually_exclusive_group()
    order.add_argument(
        "--best",
        action="store_const",
        const="best",
        dest="order",
        help="the groups (a prompt's completions) with the highest mean reward of the recent steps first",
    )
    order.add_argument(
        "--worst",
        action="store_const",
        const="worst",
        dest="order",
        help="the groups with the lowest mean reward of the recent steps first",
    )
    p.add_argument(
        "--recent",
        type=int,
        default=DEFAULT_RECENT_STEPS,
        metavar="K",
        help=f"with --best/--worst and no --step: rank the groups of the newest K steps (default {DEFAULT_RECENT_STEPS})",
    )
    p.add_argument(
        "--limit",
        type=int,
        help="show at most this many samples or episodes (default: all), or groups with --best/--worst "
        "(default 3)",
    )
    p.add_argument("--split", choices=("train", "validation"), default="train", help="default train")
    p.add_argument(
        "--episodes",
        action=argparse.BooleanOptionalAction,
        help="the episodes of episodes.jsonl (turns, trained tokens, reward), the default for a job with "
        "spec.environment; --no-episodes shows its samples.jsonl transcripts instead",
    )
    p.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new steps' samples as they come"
    )
    p.add_argument("--interval", type=float, default=5.0, help=argparse.SUPPRESS)

    p = sub(
        "rewards",
        "Per-step train reward, std, format failures, no-signal groups and validation reward.",
        f"  {PROG} rewards qwen-gsm8k\n  {PROG} rewards qwen-gsm8k --plot reward.png\n  {PROG} rewards qwen-gsm8k -o json\n"
        f"  {PROG} rewards qwen-gsm8k --columns reward,kl,entropy,length,truncated\n"
        f"  {PROG} rewards qwen-gsm8k --follow --plot reward.png   (a line per step, the PNG redrawn)",
    )
    _output(p)
    _reader_flags(p)
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw the curves into this PNG (needs matplotlib): reward and validation, and a panel each "
        "for KL, entropy, completion length, truncation and format failures where the steps have them",
    )
    p.add_argument(
        "--columns",
        metavar="A,B,...",
        help="the table's columns, in this order: reward, std, format-fail, no-signal, truncated, validation "
        "(the defaults, with each reward component), kl, entropy, length, clip, lr, loss, metric-errors, "
        "seconds, health, or a reward component's name",
    )
    p.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing each new step's line as the trainer writes it, until the job ends",
    )
    p.add_argument("--interval", type=float, default=5.0, help=argparse.SUPPRESS)

    p = sub(
        "checkpoints",
        "Published checkpoints (the latest is what a restart resumes from) and the final model.",
        f"  {PROG} checkpoints qwen-gsm8k\n  {PROG} checkpoints qwen-gsm8k -o json",
    )
    _output(p)
    _reader_flags(p)

    p = sub(
        "export",
        "Copy the final model (default), a checkpoint, the TensorBoard event files or the offline W&B runs out "
        "of the job's volume into a local directory.",
        f"  {PROG} export qwen-gsm8k --to ./model\n  {PROG} export qwen-gsm8k --step 200 --to ./step-200\n"
        f"  {PROG} export qwen-gsm8k --tensorboard --to ./tb && tensorboard --logdir ./tb\n"
        f"  {PROG} export qwen-gsm8k --wandb --to ./wb && wandb sync ./wb/offline-run-*",
    )
    _reader_flags(p)
    what = p.add_mutually_exclusive_group()
    what.add_argument("--step", type=int, help="export checkpoint step-N instead of the final model")
    what.add_argument(
        "--tensorboard",
        action="store_true",
        help="export the TensorBoard event files (spec.tracking.tensorBoard.enabled) instead of the model",
    )
    what.add_argument(
        "--wandb",
        action="store_true",
        help="export the W&B run directories (spec.tracking.wandb.mode: offline) for `wandb sync`",
    )
    p.add_argument("--to", required=True, metavar="DIR", help="local directory; must not exist or be empty")

    p = sub(
        "logs",
        "Logs of one of the job's pods (default: trainer rank 0 of the current attempt).",
        f"  {PROG} logs qwen-gsm8k -f\n  {PROG} logs qwen-gsm8k --role generation\n"
        f"  {PROG} logs qwen-gsm8k --role generation --replica 1\n  {PROG} logs qwen-gsm8k --rank 1 --tail 100\n"
        f"  {PROG} logs qwen-gsm8k --attempt 1 --tail 50   (the first attempt's trainer, from the volume)\n"
        f"  {PROG} logs qwen-gsm8k --attempt 1 --role generation   (its vLLM, with a ReadWriteMany volume)",
    )
    p.add_argument(
        "--role", choices=("trainer", "generation", "metric", "environment", "rollouts"), default="trainer"
    )
    p.add_argument(
        "--rank",
        type=int,
        default=0,
        help="trainer node rank; for generation, 0 is the vLLM pod in use and 1, 2, ... the failed ones it "
        "replaced in this attempt; for metric and environment, the pod's index by name",
    )
    p.add_argument(
        "--replica",
        type=int,
        default=0,
        help="for generation: which vLLM server of spec.generation.replicas (0, 1, ...)",
    )
    p.add_argument("-f", "--follow", action="store_true", help="stream new lines")
    p.add_argument("--tail", type=int, help="only the last N lines")
    p.add_argument(
        "--attempt",
        type=int,
        help="a gang attempt's log as kept on the job's volume, also once its pods are gone (after a "
        "restart, a failure or the end): a trainer process's (--rank is then its global rank), or with "
        "--role generation a vLLM server's (--replica; kept where the volume is ReadWriteMany)",
    )
    _reader_flags(p)

    p = sub(
        "config",
        "The job's spec with every default and the preset filled in, and the trainer.json it runs with.",
        f"  {PROG} config qwen-gsm8k\n  {PROG} config qwen-gsm8k -o json",
    )
    _output(p)

    p = sub(
        "compare",
        "Two jobs side by side: the settings that differ, and their reward curves step by step.",
        f"  {PROG} compare qwen-lr1e6 qwen-lr3e6\n  {PROG} compare qwen-lr1e6 qwen-lr3e6 --plot both.png\n"
        f"  {PROG} compare qwen-lr1e6 qwen-lr3e6 --no-curves -o json",
    )
    p.add_argument("other", metavar="OTHER", help="name of the GRPOJob to compare with (same namespace)")
    _output(p)
    _reader_flags(p)
    p.add_argument("--no-curves", action="store_true", help="settings only (no reader pods)")
    p.add_argument("--plot", metavar="FILE.png", help="also draw both reward curves into this PNG")

    p = subs.add_parser(
        "check",
        help="Check a GRPOJob manifest without a cluster: refusals, unknown fields, warnings.",
        description="What the API server would refuse in a GRPOJob manifest (the CRD's own rules), each unknown "
        "field with the name it was probably meant to be (TRL's GRPOConfig names included), and the warnings "
        "the chart's admission policy gives at apply time (unpinned images, a model name that is a URL, a "
        "run above the rollout threshold). Exit 0: it would be accepted (warnings or not); 1: refused.",
        epilog=f"Examples:\n  {PROG} check -f job.yaml\n  cat job.yaml | {PROG} check -f -\n"
        f"  {PROG} check -f job.yaml --warn-rollouts 50000000 -o json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-f", "--filename", required=True, help="the manifest (YAML, several documents allowed; - for stdin)"
    )
    p.add_argument(
        "--warn-rollouts",
        type=int,
        default=DEFAULT_WARN_ROLLOUTS,
        help=f"warn above this many rollouts, 0 never (default {DEFAULT_WARN_ROLLOUTS}, the chart's default "
        "admissionPolicies.warnings.warnAboveRollouts)",
    )
    _output(p)

    sub(
        "suspend",
        "Set spec.suspend: the operator stops the job's pods after a checkpoint; nothing is lost.",
        f"  {PROG} suspend qwen-gsm8k",
    )
    sub(
        "resume",
        "Clear spec.suspend: the job resumes from its last checkpoint.",
        f"  {PROG} resume qwen-gsm8k",
    )
    return top
