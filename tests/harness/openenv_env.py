"""TEST HARNESS — OpenEnv environments as their authors ship them, served as an environment pod serves them.

``generated_env`` runs OpenEnv's own ``openenv init`` (the template every new environment starts from: an
echo environment whose server keeps one session at a time) and ``serve`` starts its server with uvicorn, the
command its Dockerfile runs, on a local port. Nothing of the environment is changed.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path


@dataclass
class EnvironmentProcess:
    popen: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self) -> None:
        self.popen.terminate()
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.popen.kill()


def generated_env(workdir: Path, name: str = "echo_env") -> Path:
    """A new environment from ``openenv init NAME`` in ``workdir``; its directory."""
    openenv = Path(sys.executable).with_name("openenv")
    subprocess.run([str(openenv), "init", name], cwd=workdir, check=True, capture_output=True, timeout=300)
    return workdir / name


def serve(
    env_dir: Path, port: int, log: Path, timeout: float = 120, app: str = "server.app:app"
) -> EnvironmentProcess:
    """The environment's server (``uvicorn APP``, the template's ``server.app:app`` by default, run in
    ``env_dir``) on 127.0.0.1:``port``, once GET /health answers."""
    handle = log.open("wb")
    popen = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port)],
        cwd=env_dir,
        stdout=handle,
        stderr=handle,
    )
    process = EnvironmentProcess(popen, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RuntimeError(
                f"the environment server exited with {popen.returncode}: {log.read_text()[-2000:]}"
            )
        try:
            with urllib.request.urlopen(f"{process.url}/health", timeout=2):
                return process
        except OSError:
            time.sleep(0.5)
    process.stop()
    raise RuntimeError(
        f"the environment server did not answer /health within {timeout}s: {log.read_text()[-2000:]}"
    )
