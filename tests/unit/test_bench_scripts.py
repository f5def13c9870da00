"""Every benchmark script starts the way its own usage text says: `python bench/<name>.py`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
# Each script imports its whole stack (torch for gpu_check, the kube client for scale): seconds apiece, so
# these run in the trainer tier rather than `make check`.
pytestmark = pytest.mark.trainer

SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def test_every_script_is_covered() -> None:
    assert "gpu_check.py" in SCRIPTS and "scale.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_runs_by_its_path(script: str, tmp_path: Path) -> None:
    # From another directory, so nothing but the script's own bootstrap puts the repository on the path.
    done = subprocess.run(
        [sys.executable, str(BENCH / script), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"python bench/{script} --help failed:\n{done.stderr[-2000:]}"
    assert "usage:" in done.stdout
