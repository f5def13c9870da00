"""TEST HARNESS — the local runner (tests/harness/local_runner.py) as a command, for `make demo`: it plays the
kubelet for one GRPOJob's pods on the local cluster until the job ends.

    KUBECONFIG=... python -m tests.harness.run_local_job --namespace NS --job NAME --workdir DIR \
        [--metric IMAGE=COMMAND ...] [--environment IMAGE=COMMAND ...] [--timeout SECONDS]

Exits 0 when the job Succeeded, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tests.harness.kube import Cluster
from tests.harness.local_runner import LocalJobRunner


def parse_metric(values: list[str], flag: str = "--metric") -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for value in values:
        image, sep, command = value.partition("=")
        if not sep:
            raise SystemExit(f"{flag} expects IMAGE=COMMAND, got {value!r}")
        out[image] = command.split()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--metric", action="append", default=[], help="IMAGE=COMMAND (repeatable)")
    parser.add_argument(
        "--environment",
        action="append",
        default=[],
        help="IMAGE=COMMAND of an environment server (repeatable)",
    )
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()
    kubeconfig = os.environ.get("KUBECONFIG")
    if not kubeconfig:
        raise SystemExit("set KUBECONFIG to the cluster the job runs on")
    runner = LocalJobRunner(
        Cluster(Path(kubeconfig)),
        args.namespace,
        args.job,
        parse_metric(args.metric),
        args.workdir,
        environment_commands=parse_metric(args.environment, "--environment"),
    )
    phase = runner.run(args.timeout)
    print(f"[local-runner] job {args.namespace}/{args.job} finished: {phase}")
    return 0 if phase == "Succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
