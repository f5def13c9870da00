"""A vLLM server that dies on its first request (here: a model whose head size vLLM's CPU attention does not
support, which still passes /health) fails its pod, and the operator's one-line summary of it (the job's
status message and Restarting event) names the pod and the root cause in vLLM's words.

What vLLM 0.31 does here, observed: its worker raises (RuntimeError: Unsupported CPU attention
configuration: head_dim=16 ...), the engine core and the API server log their own errors after it (the
API server's EngineDeadError, once more for each failed request) and the API server exits with code 0:
the cause is logged kilobytes before the end of the log. Alone, that is a pod that succeeded with
no termination message (a kubelet copies a log tail only for a non-zero exit, and only its last 2 KB). The
pod runs vLLM under the operator's supervisor (builders/vllm_supervisor.py, run here with the same source):
an exit nobody asked for becomes exit code 1, with the log's first exception lines, then its tail, as the
termination message."""

from __future__ import annotations

import time
import urllib.error
from pathlib import Path

import pytest
from grpo_operator.builders.common import LABEL_ROLE
from grpo_operator.reconcile.observed import PodView

from tests.harness import vllm_server
from tests.harness.local_process import container_exit_code
from tests.harness.ports import free_port

pytestmark = [pytest.mark.trainer, pytest.mark.slow, pytest.mark.vllm]


def test_a_vllm_crash_on_the_first_request_is_summarised_in_vllms_words(tmp_path: Path) -> None:
    from grpo_trainer.tiny import build

    model = build(tmp_path / "head16", head_dim=16)
    container = vllm_server.rendered_container(str(model), weightSync="Volume")
    env = {**vllm_server.container_env(container), "HF_HOME": str(tmp_path / "hf")}
    server = vllm_server.start(container, env, free_port(), tmp_path / "vllm.log")
    try:
        server.wait_healthy(900)
        with pytest.raises((urllib.error.URLError, OSError)):
            server.post(
                "/v1/completions", {"model": str(model), "prompt": [3, 4, 5], "max_tokens": 2}, timeout=300
            )
        deadline = time.monotonic() + 300
        while server.popen.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
        assert server.popen.returncode is not None, "vLLM kept running after its engine died"
        code = container_exit_code(server.popen.returncode)
    finally:
        server.stop()

    assert code != 0, server.log_tail(60)
    # What a kubelet reads: the file the supervisor wrote (the pod's /dev/termination-log).
    message = server.termination_message()
    assert message and server.termination_log is not None
    assert message == server.termination_log.read_text()
    pod = {
        "metadata": {"name": "tiny-gen-1-0", "labels": {LABEL_ROLE: "generation"}},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"state": {"terminated": {"exitCode": code, "reason": "Error", "message": message}}}
            ],
        },
    }
    summary = PodView(pod).failure_summary()
    print(summary)
    assert summary.startswith(f"generation pod tiny-gen-1-0 failed: exit code {code}; "), summary
    # The root cause in vLLM's words, not the EngineDeadError the API server logs after it.
    # Observed: "(Worker pid=…) ERROR … [multiproc_executor.py:1058] RuntimeError: Unsupported CPU attention
    # configuration: head_dim=16 isa=2 kv_cache_idx=0".
    assert "Unsupported CPU attention configuration: head_dim=16" in summary, (summary, message)
    assert "EngineDeadError" not in summary, summary
    assert message.rstrip().endswith("without being asked to stop"), message
