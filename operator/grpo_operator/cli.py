"""``grpo-operator run``: the operator's command line.

    grpo-operator run --all-namespaces            # the whole cluster
    grpo-operator run -n team-a -n team-b         # only these namespaces
    grpo-operator run -n team-a --http-port 9090  # /metrics, /healthz, /readyz on :9090

Credentials: in a pod, the pod's ServiceAccount; elsewhere $KUBECONFIG (or --kubeconfig, or
~/.kube/config). Every flag has a GRPO_OPERATOR_* environment variable (see settings.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Sequence

from grpo_operator import __version__
from grpo_operator.settings import OperatorSettings, SettingsError

log = logging.getLogger("grpo_operator")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grpo-operator", description="Kubernetes operator for GRPOJobs.")
    parser.add_argument("--version", action="version", version=f"grpo-operator {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the operator until SIGTERM/SIGINT")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=None,
        metavar="NAMESPACE",
        help="watch this namespace (repeat for several); default: all namespaces",
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    run.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config, then $KUBECONFIG)")
    run.add_argument(
        "--http-host", help="address of the /metrics, /healthz, /readyz server (default 0.0.0.0)"
    )
    run.add_argument("--http-port", type=int, help="port of that server (default 8080; 0 picks a free port)")
    run.add_argument("--workers", type=int, help="jobs reconciled in parallel (default 16)")
    run.add_argument(
        "--resync-seconds", type=float, help="reconcile every job at least this often (default 30)"
    )
    run.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    run.add_argument("--log-format", choices=("plain", "json"), default="plain", help="log line format")
    return parser


def _configure_logging(verbose: bool, fmt: str) -> None:
    if fmt == "json":
        layout = '{"time":"%(asctime)s","level":"%(levelname)s","logger":"%(name)s","message":"%(message)s"}'
    else:
        layout = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=layout, stream=sys.stderr)
    # kopf's own per-object chatter is useful only when debugging the operator itself.
    logging.getLogger("kopf").setLevel(logging.DEBUG if verbose else logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _configure_logging(args.verbose, args.log_format)
    namespaces = tuple(args.namespace) if args.namespace else None
    if namespaces and any(ch in ns for ns in namespaces for ch in "*?[]!,"):
        print(
            "grpo-operator: namespace patterns are not supported: list each namespace with its own -n flag",
            file=sys.stderr,
        )
        return 2
    try:
        settings = OperatorSettings.from_env(
            os.environ,
            namespaces=namespaces,
            all_namespaces=True if args.all_namespaces else None,
            http_host=args.http_host,
            http_port=args.http_port,
            workers=args.workers,
            resync_seconds=args.resync_seconds,
        )
    except SettingsError as exc:
        print(f"grpo-operator: {exc}", file=sys.stderr)
        return 2
    if args.kubeconfig:
        # kopf's own API calls (its CRD and namespace scanning) log in through the same kubeconfig as the
        # runtime's informers and reconcile loop.
        os.environ["KUBECONFIG"] = args.kubeconfig

    # Imported here so `grpo-operator --help` works without a cluster and stays fast.
    from grpo_operator.runtime.process import make_controller, run_operator

    try:
        controller = make_controller(settings, args.kubeconfig)
    except RuntimeError as exc:
        print(f"grpo-operator: {exc}", file=sys.stderr)
        return 1
    log.info("grpo-operator %s starting", __version__)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_operator(controller))
    return 0


if __name__ == "__main__":
    sys.exit(main())
