"""Runs every documented command block tagged ``<!-- run-in-test -->`` against the test cluster, in
document order, exactly as written (bash -euo pipefail, from the repository root, with the project's
kubectl and helm first on PATH). A doc whose commands stop working fails here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.harness.docs import REPO, Block, doc_files, shell_blocks
from tests.harness.kube import Cluster, helm_binary, kubectl_binary, wait_for
from tests.harness.operator_process import Operator
from tests.harness.readiness import generation_ready

pytestmark = pytest.mark.slow

DOCS_WITH_RUNNABLE_BLOCKS = [p for p in doc_files() if any(b.tagged for b in shell_blocks(p))]


def shell_env(kube: Cluster) -> dict[str, str]:
    path = os.pathsep.join(
        [
            str(Path(kubectl_binary()).parent),
            str(Path(helm_binary()).parent),
            str(Path(sys.executable).parent),
        ]
    )
    return {**kube.env(), "PATH": f"{path}{os.pathsep}{os.environ['PATH']}"}


def run_block(kube: Cluster, block: Block, cwd: Path = REPO) -> None:
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.text],
        cwd=cwd,
        env=shell_env(kube),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (
        f"documented commands at {block.where} failed (exit {proc.returncode}):\n{block.text}\n"
        f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    )


def demo_job(kube: Cluster, tmp_path: Path) -> Iterator[None]:
    """What `make demo` leaves behind: the tiny job in namespace grpo-demo, reconciled by the operator."""
    existed = kube.get("namespace", "grpo-demo") is not None
    if not existed:
        kube.kubectl("create", "namespace", "grpo-demo")
        wait_for("default ServiceAccount", lambda: kube.get("serviceaccount", "default", "grpo-demo"))
    operator = Operator(kube, "grpo-demo", tmp_path / "operator.log")
    operator.start()
    try:
        job = yaml.safe_load((REPO / "examples" / "tiny" / "grpojob.yaml").read_text())
        if kube.get("grpojob", "tiny", "grpo-demo") is None:
            kube.apply(job, "grpo-demo")

        def phase() -> str:
            return str((kube.get("grpojob", "tiny", "grpo-demo") or {}).get("status", {}).get("phase"))

        # Running, or Succeeded when `make demo` already ran on this cluster. No vLLM runs: the generation
        # pod is Ready once started (tests/harness/readiness.py).
        with generation_ready(kube, "grpo-demo"):
            wait_for("the demo job to run", lambda: phase() in ("Running", "Succeeded"), timeout=120)
            yield
    finally:
        if not existed:
            kube.kubectl(
                "delete", "grpojob", "tiny", "-n", "grpo-demo", "--wait=true", "--timeout=60s", check=False
            )
        operator.stop()
        if not existed:
            kube.delete_namespace("grpo-demo")


def daemon(kube: Cluster, tmp_path: Path, block: Block) -> None:
    """Long-running commands (the operator): each must start and keep running until stopped."""
    for i, command in enumerate(block.commands()):
        log = tmp_path / f"daemon-{i}.log"
        with log.open("wb") as handle:
            proc = subprocess.Popen(
                ["bash", "-c", f"exec {command}"],
                cwd=REPO,
                env=shell_env(kube),
                stdout=handle,
                stderr=subprocess.STDOUT,
            )
            try:

                def started(proc: subprocess.Popen[bytes] = proc, log: Path = log) -> bool:
                    return proc.poll() is not None or "grpo-operator started" in log.read_text(
                        errors="replace"
                    )

                wait_for(f"`{command}` to start", started, timeout=60)
                assert proc.poll() is None, (
                    f"{block.where}: `{command}` exited {proc.returncode}:\n{log.read_text(errors='replace')[-2000:]}"
                )
            finally:
                proc.terminate()
                proc.wait(timeout=30)


def monitoring(kube: Cluster, tmp_path: Path, block: Block) -> None:
    """The values file the doc shows just above the command, with the Prometheus Operator's CRDs
    installed (as kube-prometheus-stack would have them) and the namespace Grafana scans."""
    from tests.helm.cluster import apply_monitoring_crds

    yaml_blocks = re.findall(r"```yaml\n(.*?)```", block.path.read_text(encoding="utf-8"), re.DOTALL)
    values = next(b for b in yaml_blocks if "values-monitoring.yaml" in b.splitlines()[0])
    (tmp_path / "values-monitoring.yaml").write_text(values)
    (tmp_path / "helm").symlink_to(REPO / "helm")
    apply_monitoring_crds(kube)
    if kube.get("namespace", "monitoring") is None:
        kube.kubectl("create", "namespace", "monitoring")
    try:
        run_block(kube, block, cwd=tmp_path)
    finally:
        subprocess.run(
            [helm_binary(), "uninstall", "grpo-operator", "-n", "grpo-system"],
            env=kube.env(),
            capture_output=True,
            timeout=120,
        )


CONTEXT_SETUPS = {"demo-job": demo_job}
RUNNERS = {"daemon": daemon, "monitoring": monitoring}


def wait_for_namespace_deletions(kube: Cluster) -> None:
    """Docs delete namespaces with --wait=false; the next doc may create the same one again."""

    def none_terminating() -> bool:
        out = kube.kubectl("get", "namespaces", "-o", "jsonpath={.items[*].status.phase}").stdout
        return "Terminating" not in out

    wait_for("namespaces deleted by the docs to be gone", none_terminating, timeout=180)


@pytest.mark.parametrize("doc", DOCS_WITH_RUNNABLE_BLOCKS, ids=lambda p: str(p.relative_to(REPO)))
def test_documented_commands_run(kube: Cluster, doc: Path, tmp_path: Path) -> None:
    try:
        for block in (b for b in shell_blocks(doc) if b.tagged):
            if block.setup is None:
                run_block(kube, block)
            elif block.setup in RUNNERS:
                RUNNERS[block.setup](kube, tmp_path, block)
            else:
                assert block.setup in CONTEXT_SETUPS, (
                    f"{block.where}: unknown run-in-test setup {block.setup!r}"
                )
                context = CONTEXT_SETUPS[block.setup](kube, tmp_path)
                next(context)
                try:
                    run_block(kube, block)
                finally:
                    next(context, None)
    finally:
        wait_for_namespace_deletions(kube)
