"""The local runner plays the kubelet for a spec.environment job's environment pod: it starts the server the
test names for the image on a local port (in PORT, and given to a callable), waits for its GET /health, and
points trainer.json's environment URL at it, as it does for the metric service."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from grpo_operator.builders.trainer_configmap import trainer_config_text
from grpo_operator.settings import OperatorSettings

from tests.harness.local_process import local_url, serve_locally
from tests.harness.local_runner import LocalJobRunner
from tests.harness.ports import free_port
from tests.unit.test_environment_builders import environment_job

# A server that answers GET /health on $PORT, as an OpenEnv environment does.
HEALTH_SERVER = """
import http.server, os
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b'{"status": "healthy"}')
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""


class ConfigOnlyCluster:
    """What LocalJobRunner.trainer_config and services read of the cluster: the job's ConfigMap."""

    def __init__(self, data: dict[str, str]) -> None:
        self.data = data

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return {"data": self.data} if (kind, name) == ("configmap", "math-config") else None


def runner(tmp_path: Path) -> LocalJobRunner:
    config = trainer_config_text(environment_job(port=8123), OperatorSettings())
    cluster = ConfigOnlyCluster({"trainer.json": config})
    return LocalJobRunner(cluster, "team-a", "math", {}, tmp_path, environment_commands={})  # type: ignore[arg-type]


def test_the_environment_url_points_at_the_local_server(tmp_path: Path) -> None:
    local = runner(tmp_path)
    local.environment_port = 45123
    config = json.loads(local.trainer_config(tmp_path).read_text())
    assert config["environment"]["url"] == "http://127.0.0.1:45123"
    assert local_url("http://math-env.team-a.svc:8123/x", 9) == "http://127.0.0.1:9/x"


def test_the_trainer_waits_for_the_environment_server_alone(tmp_path: Path) -> None:
    local = runner(tmp_path)
    assert local.services() == [None], "no metric service to wait for; the environment server is not up"


def test_a_server_is_started_with_its_port_and_waited_for_on_health(tmp_path: Path) -> None:
    port = free_port()
    pod = {"metadata": {"name": "math-env-x", "uid": "u"}}
    env = {"PORT": str(port)}
    log = tmp_path / "environment.log"
    proc = serve_locally(
        "environment server",
        pod,
        [sys.executable, "-c", HEALTH_SERVER],
        env,
        log,
        f"http://127.0.0.1:{port}/health",
        tmp_path,
    )
    try:
        assert proc.popen.poll() is None and proc.pod == "math-env-x"
    finally:
        proc.popen.terminate()
        proc.popen.wait(timeout=10)
        proc.handle.close()
    with pytest.raises(RuntimeError, match="environment server exited with 3; see"):
        serve_locally(
            "environment server",
            pod,
            [sys.executable, "-c", "raise SystemExit(3)"],
            env,
            log,
            "http://127.0.0.1:1/health",
            tmp_path,
        )
