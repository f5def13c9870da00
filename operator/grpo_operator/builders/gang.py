"""The gang: vLLM generation pods (one per spec.generation.replicas) + a Service each (`<job>-gen`,
`<job>-gen-r<r>`), trainer pods + headless Service `<job>-trainer`.

Pods are managed directly (not through Deployments or Jobs) so the operator decides what a failure
means: a failure restarts the gang under a new attempt number, because TRL's NCCL weight-sync group is
formed once between trainer rank 0 and the vLLM workers (TRL's VLLMClient.init_communicator). Every pod
therefore has restartPolicy Never. Two exceptions keep what still works: a failed vLLM pod is replaced alone
(reconcile/generation_replacement.py), and, with the Volume (no group) or Broadcast (a group the new rank 0
forms again) weight transport, failed trainers are replaced beside the running vLLM pods, whose names then
carry status.generationAttempt, the attempt they were started in (reconcile/gang.py _keep_generation).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from grpo_operator.api.compat import drop_later_defaults
from grpo_operator.api.pod_env import HF_TOKEN_ENV, RESERVED_GENERATION_ENV, RESERVED_TRAINER_ENV
from grpo_operator.api.spec import EnvVar
from grpo_operator.api.trainer_config import CONFIG_ENV, DEFAULT_OUTPUT_DIR, POLICY_PORT, generation_log_path
from grpo_operator.builders.common import (
    ANNOTATION_CONFIG_HASH,
    ANNOTATION_HASH,
    ANNOTATION_RESUME_FROM,
    CONFIG_DIR,
    CONFIG_FILE,
    HF_CACHE,
    LABEL_ATTEMPT,
    LABEL_GENERATION_REPLICA,
    LABEL_JOB,
    LABEL_NODE_RANK,
    LABEL_ROLE,
    WORKSPACE,
    Job,
    Manifest,
    Role,
    client_rollouts,
    cluster_ip_service,
    config_map_name,
    content_hash,
    generation_host,
    generation_pod_name,
    generation_replicas,
    generation_service_name,
    master_addr,
    metadata,
    metric_url,
    pvc_claim_name,
    quantity_map,
    selector_labels,
    trainer_pod_name,
    trainer_rbac_name,
    trainer_service_name,
    with_hash,
)
from grpo_operator.builders.fast_network import with_fast_network
from grpo_operator.builders.images import default_image_annotation, generation_image, trainer_image
from grpo_operator.builders.inputs import input_volumes
from grpo_operator.builders.rollouts import gateway_token_env
from grpo_operator.builders.scheduling import image_pull_secrets, kueue_labels, pod_placement
from grpo_operator.builders.security import secure_pod_spec
from grpo_operator.builders.tracking import tracking_env
from grpo_operator.builders.trainer_configmap import config_hash
from grpo_operator.builders.vllm_lora import lora_serving_args, lora_serving_env
from grpo_operator.settings import OperatorSettings

# torchrun expands nothing itself: Kubernetes substitutes $(VAR) from the container's env, so the
# command needs no shell in the image.
TRAINER_COMMAND = ["torchrun"]
TRAINER_ARGS = [
    "--nnodes=$(NNODES)",
    "--nproc-per-node=$(NPROC_PER_NODE)",
    "--node-rank=$(NODE_RANK)",
    "--master-addr=$(MASTER_ADDR)",
    "--master-port=$(MASTER_PORT)",
    "-m",
    "grpo_trainer",
]


def trainer_args(job: Job) -> list[str]:
    """torchrun's arguments. Its static rendezvous gives up after 600 s unless told otherwise, so a trainer
    pod that starts before another node's (whose image is still being pulled, say) would exit and cost a
    restart the operator's own clock (runPolicy.startupDeadlineSeconds) still allows: it waits as long."""
    timeout = f"--rdzv-conf=timeout={job.spec.run_policy.startup_deadline_seconds}"
    return [*TRAINER_ARGS[:-2], timeout, *TRAINER_ARGS[-2:]]


# How long the vLLM pod's readiness probe waits for GET /health.
VLLM_PROBE_TIMEOUT_SECONDS = 10


def _env_with_user(
    defaults: Mapping[str, str], user: Sequence[EnvVar], reserved: frozenset[str], job: Job
) -> list[dict[str, Any]]:
    """The operator's overridable defaults, then the user's variables (plain or valueFrom, as written),
    then HF_TOKEN from spec.model.tokenSecretRef, which wins over a user entry of the same name."""
    token = job.spec.model.token_secret_ref
    skip = reserved | ({HF_TOKEN_ENV} if token is not None else frozenset())
    entries: dict[str, dict[str, Any]] = {
        name: {"name": name, "value": value} for name, value in defaults.items()
    }
    for var in user:
        if var.name not in skip:
            entries[var.name] = (
                var.to_dict() if var.value_from is not None else {"name": var.name, "value": var.value or ""}
            )
    if token is not None:
        # Only a reference goes into the pod: the kubelet resolves it, so the token is never in the
        # GRPOJob, the pod spec, the operator's memory, its logs or events.
        entries[HF_TOKEN_ENV] = {
            "name": HF_TOKEN_ENV,
            "valueFrom": {"secretKeyRef": {"name": token.name, "key": token.key}},
        }
    return list(entries.values())


def gang_hash(job: Job) -> str:
    """Hash of every spec field that shapes the gang's pods or the trainer's config (gang_hash_input)."""
    return content_hash(gang_hash_input(job))


def gang_hash_input(job: Job) -> dict[str, Any]:
    """The spec fields gang_hash covers.

    Built from the spec, not from the rendered pods or trainer.json: a spec change must restart the
    gang, but an operator upgrade that renders pods or the config a little differently must not
    restart every running training job (new pods pick the new rendering up at their next start).
    The metric image, replicas and resources (and the environment server's, its sandbox and its egress), the
    run policy, retention, suspend and the budget are left out: they change the metric (or environment)
    Deployment or the operator's behaviour, never the running gang.
    """
    spec = job.spec.to_dict()
    # Fields added after the first release count only when set away from their default (and inputs only
    # when there are any): their defaults appear in every stored spec after an upgrade, and hashing them
    # would restart every running job.
    drop_later_defaults(spec)
    # One vLLM server, said or not, is the same gang: writing replicas: 1 into a running job restarts nothing.
    if spec.get("generation", {}).get("replicas") == 1:
        del spec["generation"]["replicas"]
    # spec.rollouts is left out: its source never changes, and its client part (who may reach the
    # gateway, the gateway's token) shapes only the gateway and its NetworkPolicy.
    keys = ("model", "dataset", "grpo", "generation", "trainer", "scheduling", "tracking")
    shaped = {key: spec[key] for key in keys if key in spec}
    if spec.get("inputs"):
        shaped["inputs"] = spec["inputs"]
    if "metric" in spec:
        shaped["metric"] = {
            k: v for k, v in spec["metric"].items() if k not in ("image", "replicas", "resources", "env")
        }
    if "environment" in spec:
        # What the trainer's episodes read (trainer.json's environment block, the Service's port); the rest
        # shapes the environment's Deployment and NetworkPolicy only.
        pod_only = ("image", "replicas", "resources", "env", "runtimeClassName", "egressCidrs")
        shaped["environment"] = {k: v for k, v in spec["environment"].items() if k not in pod_only}
    checkpoints = {k: v for k, v in spec["checkpoints"].items() if k != "retention"}
    return {**shaped, "checkpoints": checkpoints}


def _resources(
    requests: Mapping[str, object],
    limits: Mapping[str, object],
    defaults: Mapping[str, str],
    gpu_resource: str,
    gpus: int,
) -> dict[str, Any]:
    req = quantity_map(requests) if requests else dict(defaults)
    lim = quantity_map(limits)
    # Extended resources cannot be overcommitted: requests must equal limits.
    req[gpu_resource] = str(gpus)
    lim[gpu_resource] = str(gpus)
    return {"requests": req, "limits": lim}


def _shm_volume(settings: OperatorSettings) -> dict[str, Any]:
    return {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": settings.shm_size}}


def _pod_metadata(
    job: Job,
    settings: OperatorSettings,
    name: str,
    role: Role,
    attempt: int,
    extra_labels: dict[str, str],
    annotations: dict[str, str],
) -> dict[str, Any]:
    meta = metadata(job, name, role)
    kueue_lbls, kueue_annotations = kueue_labels(job, attempt, settings)
    meta["labels"].update({LABEL_ATTEMPT: str(attempt), **extra_labels, **kueue_lbls})
    meta["annotations"] = {
        ANNOTATION_HASH: gang_hash(job),
        ANNOTATION_CONFIG_HASH: config_hash(job, settings),
        **annotations,
        **kueue_annotations,
    }
    return meta


TERMINATION_LOG = "/dev/termination-log"
# The source of the program that runs `vllm serve` in the generation pod (builders/vllm_supervisor.py),
# read once: the pod runs it with `python3 -c`, so it needs nothing but the vLLM image.
VLLM_SUPERVISOR = resources.files("grpo_operator.builders").joinpath("vllm_supervisor.py").read_text()

# The platform's model cache claim (settings.model_cache_claim), or the vLLM pod's emptyDir without one.
MODEL_CACHE_VOLUME = "model-cache"
MODEL_CACHE_MOUNT = "/cache"


def _model_cache_volume(settings: OperatorSettings) -> dict[str, Any]:
    return {"name": MODEL_CACHE_VOLUME, "persistentVolumeClaim": {"claimName": settings.model_cache_claim}}


def hf_cache_dir(job: Job, settings: OperatorSettings) -> str:
    """HF_HOME of vLLM and the trainers: the platform's cache claim when named (shared by restarts and
    later jobs in the namespace), else the job's volume (vLLM only when ReadWriteMany), else the vLLM
    pod's emptyDir."""
    if settings.model_cache_claim:
        return f"{MODEL_CACHE_MOUNT}/huggingface"
    return HF_CACHE


def volume_shared_with_generation(job: Job) -> bool:
    """vLLM mounts the job's volume (shared model cache, a model on the volume) only when it can: a
    ReadWriteOnce claim attaches to one node, and the vLLM pod usually runs on another node than the
    trainers. For an existing claim the spec's accessMode says what the user declares it to be."""
    return job.spec.checkpoints.volume.access_mode == "ReadWriteMany"


# vLLM's --weight-transfer-config backend of each transport that has one.
WEIGHT_TRANSFER_BACKENDS = {"NCCL": "nccl", "Broadcast": "grpo-broadcast"}


def generation_pod(
    job: Job, settings: OperatorSettings, attempt: int, index: int = 0, replica: int = 0
) -> Manifest:
    """A vLLM server (replica ``replica``, its ``index``-th pod in the attempt), started the way TRL 1.16
    needs it in server mode.

    TRL's own `trl vllm-serve` only exec's `vllm serve` with these additions (TRL 1.16
    scripts/vllm_serve.py:266-293): `--weight-transfer-config '{"backend":"nccl"}'` (else
    init_communicator raises), `--logprobs-mode processed_logprobs` (else the importance-sampling
    correction is biased), `--max-logprobs -1`, and `VLLM_SERVER_DEV_MODE=1` (else /server_info and the
    weight-update routes return 404). So the pod needs no TRL, only the vLLM image.
    """
    spec = job.spec
    gen = spec.generation
    args = [
        spec.model.name,
        "--revision",
        spec.model.revision,
        "--host",
        "0.0.0.0",
        "--port",
        str(settings.vllm_port),
        "--tensor-parallel-size",
        str(gen.tensor_parallel_size),
        "--gpu-memory-utilization",
        str(gen.gpu_memory_utilization),
        "--dtype",
        spec.model.dtype,
        "--seed",
        # Each replica its own sampling seed: same-seeded servers would draw the same random numbers for
        # the different prompts they are sent, correlating groups that should be independent.
        str(spec.grpo.seed + replica),
        "--logprobs-mode",
        "processed_logprobs",
        "--max-logprobs",
        "-1",
    ]
    # NCCL: TRL's init_communicator refuses a server without a weight-transfer engine. Broadcast: the
    # project's engine (grpo_weight_broadcast, a vLLM plugin in the project's vLLM image) joins the group
    # of trainer rank 0 and every replica. Volume: the weights arrive through /collective_rpc
    # reload_weights, which needs none. The weight routes are dev-mode routes: VLLM_SERVER_DEV_MODE below.
    backend = WEIGHT_TRANSFER_BACKENDS.get(gen.weight_transport() or "")
    if backend is not None:
        args += ["--weight-transfer-config", f'{{"backend":"{backend}"}}']
    # No --data-parallel-size: the spec requires gpus == tensorParallelSize, because TRL 1.16 supports
    # vLLM data parallelism only for MoE models (scripts/vllm_serve.py:38-40).
    # Unset: -1, vLLM's auto-fit (the model's own context length, lowered to what the KV cache can hold on
    # these GPUs). Without it a long-context model (128k tokens and more) whose full context does not fit
    # at this gpuMemoryUtilization makes vLLM refuse to start, after the whole model load, and the job
    # spends its start-up budget on restarts that fail the same way.
    args += ["--max-model-len", str(gen.max_model_len) if gen.max_model_len is not None else "-1"]
    # LoRA jobs syncing through the volume: vLLM serves the trainer's adapter, loaded each step (vllm_lora.py).
    args += lora_serving_args(spec)

    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    volumes: list[dict[str, Any]] = [_shm_volume(settings)]
    keep_log: list[str] = []
    if volume_shared_with_generation(job):
        # The pod mounts the job's volume: vLLM's output is kept there too, past the pod's deletion.
        keep_log = ["--keep-log", generation_log_path(DEFAULT_OUTPUT_DIR, attempt, replica)]
        mounts.append({"name": "workspace", "mountPath": WORKSPACE})
        volumes.append({"name": "workspace", "persistentVolumeClaim": {"claimName": pvc_claim_name(job)}})
    hf_home = hf_cache_dir(job, settings)
    if settings.model_cache_claim:
        mounts.append({"name": MODEL_CACHE_VOLUME, "mountPath": MODEL_CACHE_MOUNT})
        volumes.append(_model_cache_volume(settings))
    elif not volume_shared_with_generation(job):
        # No volume vLLM can mount: the download lives as long as the pod, and every gang restart
        # downloads the model again (docs/operations.md: ReadWriteMany, or a cache claim, avoid it).
        mounts.append({"name": MODEL_CACHE_VOLUME, "mountPath": MODEL_CACHE_MOUNT})
        volumes.append({"name": MODEL_CACHE_VOLUME, "emptyDir": {}})
        hf_home = f"{MODEL_CACHE_MOUNT}/huggingface"

    input_vols, input_mounts = input_volumes(job)
    mounts += input_mounts
    volumes += input_vols

    container: dict[str, Any] = {
        "name": "vllm",
        "image": generation_image(job.spec, settings),
        "imagePullPolicy": settings.image_pull_policy,
        # `vllm serve` under a supervisor: vLLM 0.31 exits with code 0 when its engine core dies (an
        # unsupported model, out of memory), so the pod would succeed and the kubelet would keep none of its
        # log; its root cause, logged kilobytes before the end, would not fit the kubelet's 2 KB tail anyway.
        # The supervisor passes the logs through, forwards SIGTERM/SIGINT, and on any exit it was not asked
        # for writes the log's exception lines and tail to the termination message and exits non-zero.
        # Kubernetes appends args to command, so vLLM still gets `vllm serve <args>`.
        "command": [
            "python3",
            "-c",
            VLLM_SUPERVISOR,
            "--termination-log",
            TERMINATION_LOG,
            *keep_log,
            "--",
            "vllm",
            "serve",
        ],
        "args": args,
        "env": [
            {"name": "VLLM_SERVER_DEV_MODE", "value": "1"},
            *_env_with_user(
                {
                    "VLLM_NO_USAGE_STATS": "1",
                    "HF_HOME": hf_home,
                    "HF_HUB_DISABLE_TELEMETRY": "1",
                    **lora_serving_env(spec),
                },
                gen.env,
                RESERVED_GENERATION_ENV,
                job,
            ),
        ],
        "ports": [{"name": "http", "containerPort": settings.vllm_port, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 10,
            # The kubelet's default of 1 s is short for an API server busy tokenising a step's prompts:
            # three slow answers in a row would take a healthy server out of its Service mid-step.
            "timeoutSeconds": VLLM_PROBE_TIMEOUT_SECONDS,
            "failureThreshold": 3,
        },
        "resources": _resources(
            gen.resources.requests,
            gen.resources.limits,
            settings.default_generation_requests,
            settings.gpu_resource,
            gen.gpus,
        ),
        "volumeMounts": mounts,
        # The supervisor writes vLLM's failure here; the log's tail is the fallback when it could not.
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "containers": [container],
        "volumes": volumes,
        **pod_placement(job, settings, gpu=True),
        **image_pull_secrets(job, settings),
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _pod_metadata(
            job,
            settings,
            generation_pod_name(job, attempt, index, replica),
            "generation",
            attempt,
            {LABEL_GENERATION_REPLICA: str(replica)},
            default_image_annotation(job.spec.generation.image, settings.vllm_image),
        ),
        "spec": secure_pod_spec(pod_spec, settings),
    }
    return with_fast_network(pod, settings)


def generation_service(job: Job, settings: OperatorSettings, replica: int = 0) -> Manifest:
    # Selects by role (and replica), not by attempt: the Service stays put while the pod behind it changes.
    # The weight-sync port is not here on purpose: trainer rank 0 binds it and vLLM connects to it
    # when TRL forms the NCCL group, so it is published on the trainer Service.
    # With one server the selector is the job and role alone, as before replicas existed (its pods from an
    # older operator have no replica label); with several, each Service selects its replica's pods.
    selector = None
    if job.spec.generation.replica_count() > 1:
        selector = {LABEL_JOB: job.name, LABEL_ROLE: "generation", LABEL_GENERATION_REPLICA: str(replica)}
    return cluster_ip_service(
        job,
        generation_service_name(job, replica),
        "generation",
        [("http", settings.vllm_port, "http")],
        selector,
    )


def generation_services(job: Job, settings: OperatorSettings) -> list[Manifest]:
    """One Service per vLLM server, in replica order."""
    return [generation_service(job, settings, replica) for replica in generation_replicas(job)]


def trainer_env(
    job: Job, settings: OperatorSettings, attempt: int, rank: int, resume_from: str
) -> list[dict[str, Any]]:
    spec = job.spec
    nproc = spec.trainer.gpus_per_node
    defaults = {
        "HF_HOME": hf_cache_dir(job, settings),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "NCCL_DEBUG": "WARN",
    }
    env = _env_with_user(defaults, spec.trainer.env, RESERVED_TRAINER_ENV, job)
    env += [
        {"name": CONFIG_ENV, "value": CONFIG_FILE},
        {"name": "RESUME_FROM", "value": resume_from},
        # torchrun overrides RANK and WORLD_SIZE per process; the pod-level values describe the pod's
        # first process, so `python -m grpo_trainer` without torchrun sees a consistent layout too.
        {"name": "RANK", "value": str(rank * nproc)},
        {"name": "WORLD_SIZE", "value": str(spec.trainer.nodes * nproc)},
        {"name": "NODE_RANK", "value": str(rank)},
        {"name": "NNODES", "value": str(spec.trainer.nodes)},
        {"name": "NPROC_PER_NODE", "value": str(nproc)},
        {"name": "MASTER_ADDR", "value": master_addr(job, attempt)},
        {"name": "MASTER_PORT", "value": str(settings.master_port)},
        {"name": "GRPO_JOB_NAMESPACE", "value": job.namespace},
        {"name": "GRPO_JOB_NAME", "value": job.name},
        {"name": "GRPO_TRAINER_ATTEMPT", "value": str(attempt)},
        # The same endpoints as in trainer.json, for tools and debugging shells in the pod.
        {"name": "GRPO_VLLM_URL", "value": f"http://{generation_host(job)}:{settings.vllm_port}"},
        *([{"name": "GRPO_METRIC_URL", "value": url}] if (url := metric_url(job)) else []),
        # vLLM workers connect back to trainer rank 0 at this address for weight sync; without it
        # vLLM guesses the address from a route to 8.8.8.8.
        {"name": "VLLM_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    if rank == 0 and client_rollouts(job):
        # Only rank 0 talks to the gateway's internal port (grpo_trainer.client_loop: env.is_main).
        env.append(gateway_token_env(job))
    if rank == 0:
        # Only rank 0 reports to trackers (grpo_trainer.tracking); the other ranks never see their keys.
        env += tracking_env(job, settings)
    return env


def trainer_pod(job: Job, settings: OperatorSettings, attempt: int, rank: int, resume_from: str) -> Manifest:
    """Trainer pod for node rank `rank` of gang incarnation `attempt`."""
    spec = job.spec
    name = trainer_pod_name(job, attempt, rank)
    ports = [{"name": "rendezvous", "containerPort": settings.master_port, "protocol": "TCP"}]
    annotations = {
        ANNOTATION_RESUME_FROM: resume_from,
        **default_image_annotation(spec.trainer.image, settings.trainer_image),
    }
    if rank == 0:
        ports += [
            {"name": "weight-sync", "containerPort": settings.weight_sync_port, "protocol": "TCP"},
            {"name": "metrics", "containerPort": settings.trainer_metrics_port, "protocol": "TCP"},
        ]
        if client_rollouts(job):
            # The policy server the rollout gateway forwards the client's completion requests to.
            ports.append({"name": "policy", "containerPort": POLICY_PORT, "protocol": "TCP"})
        annotations.update(
            {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(settings.trainer_metrics_port),
                "prometheus.io/path": "/metrics",
            }
        )
    container: dict[str, Any] = {
        "name": "trainer",
        "image": trainer_image(spec, settings),
        "imagePullPolicy": settings.image_pull_policy,
        "command": TRAINER_COMMAND,
        "args": trainer_args(job),
        "env": trainer_env(job, settings, attempt, rank, resume_from),
        "ports": ports,
        "resources": _resources(
            spec.trainer.resources.requests,
            spec.trainer.resources.limits,
            settings.default_trainer_requests,
            settings.gpu_resource,
            spec.trainer.gpus_per_node,
        ),
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "workspace", "mountPath": WORKSPACE},
            {"name": "dshm", "mountPath": "/dev/shm"},
            *(
                [{"name": MODEL_CACHE_VOLUME, "mountPath": MODEL_CACHE_MOUNT}]
                if settings.model_cache_claim
                else []
            ),
            *input_volumes(job)[1],
        ],
        # The trainer writes a one-line failure reason here; the operator shows it in status.message.
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "serviceAccountName": trainer_rbac_name(job),
        # Only rank 0 patches the job's status; the other ranks get no API credential at all.
        "automountServiceAccountToken": rank == 0,
        # Stable DNS through the headless Service: <pod>.<job>-trainer.<namespace>.svc (MASTER_ADDR).
        "hostname": name,
        "subdomain": trainer_service_name(job),
        # Time for the trainer to write a checkpoint after SIGTERM (suspend, eviction, preemption).
        "terminationGracePeriodSeconds": settings.trainer_termination_grace_seconds,
        "containers": [container],
        "volumes": [
            {"name": "config", "configMap": {"name": config_map_name(job)}},
            {"name": "workspace", "persistentVolumeClaim": {"claimName": pvc_claim_name(job)}},
            _shm_volume(settings),
            *([_model_cache_volume(settings)] if settings.model_cache_claim else []),
            *input_volumes(job)[0],
        ],
        **pod_placement(job, settings, gpu=True),
        **image_pull_secrets(job, settings),
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _pod_metadata(
            job, settings, name, "trainer", attempt, {LABEL_NODE_RANK: str(rank)}, annotations
        ),
        "spec": secure_pod_spec(pod_spec, settings),
    }
    return with_fast_network(pod, settings)


def trainer_service(job: Job, settings: OperatorSettings) -> Manifest:
    # Headless, and publishing not-ready pods: torch.distributed must resolve rank 0 before anything
    # in the trainer is "ready".
    return with_hash(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metadata(job, trainer_service_name(job), "trainer"),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": selector_labels(job, "trainer"),
                "ports": [
                    {"name": "rendezvous", "port": settings.master_port, "protocol": "TCP"},
                    {"name": "weight-sync", "port": settings.weight_sync_port, "protocol": "TCP"},
                    {"name": "metrics", "port": settings.trainer_metrics_port, "protocol": "TCP"},
                ],
            },
        }
    )


def gang_pods(
    job: Job,
    settings: OperatorSettings,
    attempt: int,
    resume_from: str,
    generation_indices: Mapping[int, int] | None = None,
    generation_attempt: int | None = None,
) -> list[Manifest]:
    """Every pod of one gang incarnation: the vLLM servers first (in replica order), then trainer ranks
    0..nodes-1. ``generation_indices`` counts, per replica, the attempt's replacements of its vLLM pod
    (absent: 0, the first one); ``generation_attempt``: the attempt of the vLLM pods, when a restart of the
    trainers alone kept them (absent: ``attempt``)."""
    indices = generation_indices or {}
    served_by = attempt if generation_attempt is None else generation_attempt
    pods = [
        generation_pod(job, settings, served_by, indices.get(replica, 0), replica)
        for replica in generation_replicas(job)
    ]
    pods += [trainer_pod(job, settings, attempt, rank, resume_from) for rank in range(job.spec.trainer.nodes)]
    return pods
