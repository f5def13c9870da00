"""Reading a job's volume through `kubectl exec` into the reader pod: a failed exec says what failed and,
for the project's local cluster (simulated nodes, where exec cannot work), which setting reads it instead."""

from __future__ import annotations

import pytest
from grpo_operator.kubectl_plugin.errors import PluginError
from grpo_operator.kubectl_plugin.volume import ExecTransport


def test_a_failed_exec_names_the_error_and_the_hostpath_setting() -> None:
    # A stand-in for kubectl that fails as exec does against a node without a container runtime.
    kubectl = ["sh", "-c", "echo 'error: unable to upgrade connection: pod not found' >&2; exit 1", "kubectl"]
    transport = ExecTransport(kubectl, "grpo-reader-x")
    with pytest.raises(PluginError) as info:
        transport.size("/workspace/output/metrics.jsonl")
    message = str(info.value)
    assert "kubectl exec exited 1): error: unable to upgrade connection: pod not found" in message
    assert message.endswith("set KUBECTL_GRPO_VOLUME_ACCESS=hostpath")
