"""Runs every documented command block tagged ``<!-- run-in-test -->`` against the test cluster, in
document order, exactly as written (bash -euo pipefail, from the repository root, with the project's
kubectl and helm first on PATH). A doc whose commands stop working fails here."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.harness.docs import REPO, Block, doc_files, shell_blocks
from tests.harness.kube import Cluster, helm_binary, kubectl_binary, wait_for
from tests.integration.test_operator import Operator

pytestmark = pytest.mark.slow

DOCS_WITH_RUNNABLE_BLOCKS = [p for p in doc_files() if any(b.tagged for b in shell_blocks(p))]


def run_block(kube: Cluster, block: Block) -> None:
    path = os.pathsep.join(
        [
            str(Path(kubectl_binary()).parent),
            str(Path(helm_binary()).parent),
            str(Path(sys.executable).parent),
        ]
    )
    env = {**kube.env(), "PATH": f"{path}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.text],
        cwd=REPO,
        env=env,
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

        # Running, or Succeeded when `make demo` already ran on this cluster.
        wait_for("the demo job to run", lambda: phase() in ("Running", "Succeeded"), timeout=120)
        yield
    finally:
        if not existed:
            kube.kubectl(
                "delete", "grpojob", "tiny", "-n", "grpo-demo", "--wait=true", "--timeout=60s", check=False
            )
        operator.stop()
        if not existed:
            kube.kubectl("delete", "namespace", "grpo-demo", "--wait=false", check=False)


SETUPS = {"demo-job": demo_job}


@pytest.mark.parametrize("doc", DOCS_WITH_RUNNABLE_BLOCKS, ids=lambda p: str(p.relative_to(REPO)))
def test_documented_commands_run(kube: Cluster, doc: Path, tmp_path: Path) -> None:
    for block in (b for b in shell_blocks(doc) if b.tagged):
        if block.setup is None:
            run_block(kube, block)
            continue
        assert block.setup in SETUPS, f"{block.where}: unknown run-in-test setup {block.setup!r}"
        context = SETUPS[block.setup](kube, tmp_path)
        next(context)
        try:
            run_block(kube, block)
        finally:
            next(context, None)
