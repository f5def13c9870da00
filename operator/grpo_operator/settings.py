"""Operator-wide settings: what is the same for every GRPOJob this operator runs.

Per-job choices live in the GRPOJob spec; these are the cluster facts (which resource name GPUs have,
which taint GPU nodes carry, which ports the data plane uses) and the operator's own knobs (how often
to resync, where to serve /metrics). Pure data, no I/O: builders and reconcile take it as an argument.

Every field can be set from the environment as ``GRPO_OPERATOR_<FIELD NAME IN UPPER CASE>`` (the Helm
chart does that) and the most common ones from ``grpo-operator run`` flags, which win over the
environment.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from grpo_operator.api.base import describe_validation_error
from grpo_operator.api.budget import NamespaceBudget
from grpo_operator.api.exit_codes import PERMANENT_EXIT_CODES
from grpo_operator.api.fast_network import NETWORK_SETTINGS, scalar
from grpo_operator.api.image_prefixes import image_allowed
from grpo_operator.api.learning_health import LearningHealthSpec
from grpo_operator.api.network_peer import peer_problem
from grpo_operator.api.node_affinity import requirement_problem
from grpo_operator.api.pricing import PriceTable
from grpo_operator.api.team_policy import parse_teams
from grpo_operator.api.tracking import TrackingSpec
from grpo_operator.api.trainer_config import TRAINER_METRICS_PORT, VLLM_SERVER_PORT, WEIGHT_SYNC_PORT
from grpo_operator.api.workloads import DEFAULT_TRAINER_IMAGE, DEFAULT_VLLM_IMAGE

ENV_PREFIX = "GRPO_OPERATOR_"
POD_SECURITY_LEVELS = ("restricted", "baseline", "privileged")
MAX_ID = 2**31 - 1
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# Field metadata key marking a setting the trainer must see too (in trainer.json or its environment):
# the operator puts the same value on the pods and Services, so the two sides can only agree if the
# builders render it. tests/unit/test_builders.py checks every field so marked.
DATA_PLANE = "data_plane"


class SettingsError(ValueError):
    """A setting from the environment or the command line cannot be used."""


@dataclass(frozen=True)
class OperatorSettings:
    """Settings shared by every job; see the module docstring for how to set them."""

    # --- where the operator looks and how it reacts ---------------------------------------------------
    # Namespaces to watch; empty with all_namespaces=True means the whole cluster.
    namespaces: tuple[str, ...] = ()
    all_namespaces: bool = False
    # Every known job is reconciled at least this often, even without any watch event: deadlines and
    # stall detection are time-based, and a missed watch event must not leave a job unattended.
    resync_seconds: float = 30.0
    # Jobs reconciled in parallel. One job is never reconciled by two workers at once. A reconcile reads
    # from the watch caches and spends its time waiting for its writes, so workers are cheap; with 4,
    # 300 jobs applied at once queued behind them (bench/scale.py, docs/scaling.md).
    workers: int = 16
    # A change to a job's deployments and pods reconciles the job this many seconds after the first such
    # change (a pod scheduled, started, ready; the metric Deployment's availability), with every change
    # that arrived meanwhile; the other children (a claim bound, a Service changed) wake it at once
    # (builders/child_kinds.py, each kind's `wake`). A pod goes from scheduled to Running in well under a second on a quick
    # cluster, and without batching each step was its own reconcile and often its own status write. A
    # change to the GRPOJob itself is reconciled at once. 0 reconciles on every change.
    child_event_batch_seconds: float = 0.5
    # A new gang whose checkpoint claim must be bound before its pods are created (its StorageClass binds
    # immediately) says so in its status (Pending, WaitingForVolume) once the claim is this many seconds
    # old. Until then the job reads "waiting for the pods to be created". Saying it costs two status writes
    # (to say it, and to say it is over), so a binding that takes the usual time should not pay them:
    # dynamic provisioners commonly take seconds to tens of seconds, and the local cluster's PV controller
    # bound claims up to 25 s after their creation with 300 jobs arriving at once (docs/scaling.md).
    volume_wait_reported_seconds: float = 30.0
    # Timeout of one Kubernetes API request made by the reconcile loop.
    api_timeout_seconds: float = 30.0
    # Port of the HTTP server with /metrics, /healthz and /readyz (0 picks a free port, for tests).
    http_host: str = "0.0.0.0"
    http_port: int = 8080

    # --- GPU nodes --------------------------------------------------------------------------------------
    # Extended resource name the NVIDIA device plugin advertises.
    gpu_resource: str = "nvidia.com/gpu"
    # Node labels every GPU pod requires. Empty by default: the nvidia.com/gpu request alone lands GPU
    # pods on nodes whose device plugin advertises GPUs, whereas any label (GPU feature discovery's
    # nvidia.com/gpu.present, a cloud's accelerator label) exists only on some clusters and leaves every
    # job Pending on the others. docs/platform.md lists the labels per cluster kind.
    gpu_node_selector: Mapping[str, str] = field(default_factory=dict)
    # Tolerations every GPU pod gets: the nvidia.com/gpu taint, whatever its value and effect, which the
    # GPU operator, GKE and EKS's GPU node groups put on GPU nodes, and sku=gpu:NoSchedule, the taint AKS
    # documents for GPU node pools. A toleration only allows a node; the GPU request still decides.
    gpu_tolerations: tuple[Mapping[str, Any], ...] = (
        {"key": "nvidia.com/gpu", "operator": "Exists"},
        {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
    )
    # Node-affinity requirements every GPU pod (vLLM and trainers) must meet on top of gpu_node_selector,
    # as NodeSelectorRequirements ({"key", "operator", "values"}): what a label selector cannot say, such as
    # a lowest driver version. The stock images are CUDA 13 and need an R580 or newer driver: with GPU
    # feature discovery, [{"key": "nvidia.com/cuda.driver-version.major", "operator": "Gt", "values":
    # ["579"]}]. Added to every required term of a job's own node affinity, because the API server ORs
    # the terms: a term without it would admit any node. Environment: a JSON list, as the Helm value
    # jobDefaults.gpuNodeAffinity. Empty by default: the label exists only where GPU feature discovery runs.
    gpu_node_affinity: tuple[Mapping[str, Any], ...] = ()

    # --- data-plane ports: on the pods and Services, and rendered into each trainer's config -----------
    # torch.distributed rendezvous on trainer rank 0 (trainer env MASTER_PORT).
    master_port: int = field(default=29500, metadata={DATA_PLANE: True})
    # vLLM HTTP server: OpenAI API and TRL's dev-mode RL routes (trainer.json generation.serverPort).
    vllm_port: int = field(default=VLLM_SERVER_PORT, metadata={DATA_PLANE: True})
    # TRL vllm_group_port: TCPStore bound by trainer rank 0, vLLM workers connect to it
    # (trainer.json generation.weightSyncPort).
    weight_sync_port: int = field(default=WEIGHT_SYNC_PORT, metadata={DATA_PLANE: True})
    # Trainer rank 0 /metrics (trainer.json metricsPort).
    trainer_metrics_port: int = field(default=TRAINER_METRICS_PORT, metadata={DATA_PLANE: True})

    # --- who may scrape vLLM ------------------------------------------------------------------------------
    # NetworkPolicyPeer objects (podSelector / namespaceSelector / ipBlock, as in a NetworkPolicy's
    # `from`) admitted to the vLLM pods' HTTP port (vllm_port) so Prometheus can scrape their /metrics.
    # Each job's NetworkPolicy otherwise admits only that job's trainers. vLLM serves /metrics on the
    # same port as its API, development routes that change the model being trained included, and a
    # NetworkPolicy cannot tell paths apart: whoever is named here can reach that API too. Hence empty
    # by default and only to peers named explicitly (e.g. the Prometheus pods of the monitoring
    # namespace). Environment: a JSON list, as the Helm value metrics.podMonitors.generation.allowFrom.
    metrics_scrapers: tuple[Mapping[str, Any], ...] = ()
    # NetworkPolicyPeers admitted to trainer rank 0's metrics port (trainer_metrics_port) only, in
    # addition to metrics_scrapers: each job's trainer NetworkPolicy otherwise admits only that job's
    # vLLM and trainer pods. That port serves nothing but /metrics, so naming a scraper here does not open
    # vLLM's API. Environment: a JSON list, as the Helm value metrics.podMonitors.trainer.allowFrom.
    trainer_metrics_scrapers: tuple[Mapping[str, Any], ...] = ()

    # --- model cache ----------------------------------------------------------------------------------------
    # Name of a PersistentVolumeClaim (ReadWriteMany) that exists in every namespace running jobs, mounted
    # at /cache in vLLM and trainer pods as the Hugging Face cache (HF_HOME=/cache/huggingface): gang
    # restarts and later jobs in that namespace reuse downloaded models. Empty: the cache is on the job's
    # volume (for vLLM only when it is ReadWriteMany, else in the vLLM pod's emptyDir).
    model_cache_claim: str = ""

    # --- pods ---------------------------------------------------------------------------------------------
    # Images of the trainer (and rollout gateway) and vLLM pods of jobs that leave spec.trainer.image or
    # spec.generation.image unset (Helm: jobDefaults.images.trainer, .generation). Read when pods are built,
    # never written into a job: a platform behind a registry mirror names its copies here once. A changed
    # image replaces the running gangs of such jobs (their pods no longer match), trainer and vLLM together.
    trainer_image: str = DEFAULT_TRAINER_IMAGE
    vllm_image: str = DEFAULT_VLLM_IMAGE
    image_pull_policy: str = "IfNotPresent"
    # Pull secrets every job's pods get, before the job's own spec.imagePullSecrets: a registry secret the
    # platform keeps in every tenant namespace. Pods are given them explicitly because trainer pods run
    # under the job's ServiceAccount, which has none of the default ServiceAccount's pull secrets.
    image_pull_secrets: tuple[str, ...] = ()
    # Time a trainer gets between SIGTERM and SIGKILL: enough to write one checkpoint (suspend, eviction).
    trainer_termination_grace_seconds: int = 300
    # Size of the in-memory /dev/shm of trainer and vLLM pods (NCCL and the dataloader use shared memory).
    shm_size: str = "16Gi"
    # Platform defaults of spec.grpo.learningHealth (the learning-health thresholds), for the fields a job
    # leaves unset; JSON, camelCase keys. Helm: jobDefaults.learningHealth.
    learning_health_defaults: Mapping[str, Any] = field(default_factory=dict)
    # Platform defaults of spec.tracking (experiment trackers), one whole block per tracker a job leaves
    # unset, e.g. an MLflow server every job logs to; JSON, camelCase keys. Helm: jobDefaults.tracking.
    tracking_defaults: Mapping[str, Any] = field(default_factory=dict)
    # Requests used when the spec gives none: the scheduler needs them to place pods sensibly.
    default_metric_requests: Mapping[str, str] = field(
        default_factory=lambda: {"cpu": "250m", "memory": "256Mi"}
    )
    default_generation_requests: Mapping[str, str] = field(
        default_factory=lambda: {"cpu": "4", "memory": "32Gi"}
    )
    default_trainer_requests: Mapping[str, str] = field(
        default_factory=lambda: {"cpu": "8", "memory": "64Gi"}
    )
    # Pod Security Standard every job pod meets (builders/security.py, docs/platform.md): "restricted"
    # (non-root, RuntimeDefault seccomp, no capabilities; tenant namespaces may enforce restricted),
    # "baseline" (the same, but the image's own user, root included; namespaces may enforce baseline) or
    # "privileged" (baseline plus the IPC_LOCK capability of ipc_lock, which only the privileged standard
    # allows: namespaces must enforce nothing). No pod is ever privileged: true, at any level.
    pod_security: str = "restricted"
    # User and group job containers run as under "restricted" (the project's images use 65532), and the
    # group that owns the job's volume (fsGroup, both levels) so the trainer can write checkpoints.
    pod_run_as_user: int = 65532
    pod_run_as_group: int = 65532
    pod_fs_group: int = 65532

    # --- fast networks: RDMA and secondary networks for NCCL (docs/platform.md, "Fast networks") -----------
    # Applied to every trainer and vLLM pod (weights go from trainer rank 0 to the vLLM workers over NCCL,
    # gradients between trainer nodes), never to the metric service. All JSON objects; off while empty.
    # Extra resources each such pod requests (requests = limits), e.g. the RDMA shared device plugin's
    # {"rdma/rdma_shared_device_a": "1"} or an SR-IOV VF {"nvidia.com/hostdev": "1"}. Whole numbers only:
    # device plugins advertise countable devices. Replaces a job's own request of the same resource.
    network_resources: Mapping[str, str] = field(default_factory=dict)
    # Annotations of those pods, e.g. Multus {"k8s.v1.cni.cncf.io/networks": "rdma-net"}.
    network_pod_annotations: Mapping[str, str] = field(default_factory=dict)
    # Variables of their containers, e.g. {"NCCL_SOCKET_IFNAME": "net1", "NCCL_IB_HCA": "mlx5_0",
    # "NCCL_IB_GID_INDEX": "3"}. They win over a job's own variables of the same name (dropped): which
    # interface and HCA carry the traffic is a fact of the nodes, not of the job.
    network_env: Mapping[str, str] = field(default_factory=dict)
    # Add the IPC_LOCK capability to trainer and vLLM containers (RDMA pins buffers beyond the memlock
    # limit with it). Requires pod_security "privileged"; effective only for a container running as root.
    ipc_lock: bool = False

    # Trainer exit codes that mean "retrying cannot help": the job fails at once instead of spending its
    # backoffLimit. The default is every code the exit-code catalog marks permanent (api/exit_codes.py, also
    # the restart policy's default; tests/unit/test_restart_policy.py keeps the two equal), listed with
    # their meanings in docs/operations.md.
    permanent_exit_codes: tuple[int, ...] = PERMANENT_EXIT_CODES

    # --- platform limits (Helm: platformPolicy.*; the chart's admission policy enforces the same) ---------
    # Every limit is off while empty (or 0). The operator checks a job against them before creating its
    # children; a job that breaks one gets the PlatformPolicy condition and creates no pods.
    # Image references (metric, trainer, vLLM) must start with one of these, e.g. "registry.example.com/".
    allowed_image_prefixes: tuple[str, ...] = ()
    # PriorityClasses a job may name in spec.scheduling.priorityClassName.
    allowed_priority_classes: tuple[str, ...] = ()
    # Taint keys a job's own tolerations may name (the operator's GPU tolerations are not the job's).
    allowed_toleration_keys: tuple[str, ...] = ()
    # Node labels a job may select on: "key" (any value) or "key=value". With a list set, a job's
    # nodeAffinity is refused too: its terms could select on any label.
    allowed_node_selectors: tuple[str, ...] = ()
    # Whether a job may mount an existing claim (spec.checkpoints.volume.existingClaim), and which ones
    # (empty: any claim of its namespace).
    allow_existing_claims: bool = True
    allowed_existing_claims: tuple[str, ...] = ()
    # GPUs one job may request in all (0: no limit): generation.replicas * generation.gpus
    # + trainer.nodes * trainer.gpusPerNode,
    # plus every GPU-class resource any of its pods requests in spec.*.resources, times that role's pods.
    max_gpus_per_job: int = 0
    # Resource names that are GPUs for max_gpus_per_job: exact names, or prefixes written with a
    # trailing "*" (a MIG slice is a GPU too, under one name per profile). gpu_resource always counts.
    # Helm: platformPolicy.gpuResourceNames, rendered into the admission policy as well.
    gpu_resource_names: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/mig-*")
    # Kueue LocalQueue of jobs that name none; the LocalQueues a job may name; whether every job must
    # end up in a queue (without a default: must name one).
    default_queue_name: str = ""
    allowed_queue_names: tuple[str, ...] = ()
    require_queue_name: bool = False

    # --- prices and budgets (Helm: pricing, budgets; docs/platform.md "Budgets") ---------------------------
    # The price table (api/pricing.py PriceTable; JSON, camelCase keys): currency, gpuHour (default, by
    # resource, by node label), metric calls and environment episodes per thousand, storage per GB-month.
    # Empty: no prices; jobs report GPU-hours only, and a job with spec.budget.amount is held.
    prices: Mapping[str, Any] = field(default_factory=dict)
    # Budgets per namespace (api/budget.py NamespaceBudget; JSON object keyed by namespace, "*" for every
    # namespace not named): the default budget of jobs without spec.budget and the maxima none may pass.
    namespace_budgets: Mapping[str, Any] = field(default_factory=dict)

    # --- per-team policy (Helm: teams; docs/platform.md "Teams") --------------------------------------------
    # A JSON list of api/team_policy.py TeamPolicy objects: each names its namespaces and the settings that
    # differ for them (limits, queue, images, GPU placement, job defaults, budget). for_namespace applies them.
    team_policies: tuple[Mapping[str, Any], ...] = ()
    # For a team's settings: the Helm value that set each platform limit the team replaced, by its
    # platformPolicy key (messages name it; limit_name). Filled by for_namespace, never set directly.
    policy_sources: Mapping[str, str] = field(default_factory=dict)

    # --- identity -----------------------------------------------------------------------------------------
    # Field manager and event source of everything the operator writes.
    component: str = "grpo-operator"

    def __post_init__(self) -> None:
        _check_defaults(
            LearningHealthSpec,
            self.learning_health_defaults,
            "learning_health_defaults (Helm jobDefaults.learningHealth)",
            "the keys and ranges of spec.grpo.learningHealth",
        )
        _check_defaults(
            TrackingSpec,
            self.tracking_defaults,
            "tracking_defaults (Helm jobDefaults.tracking)",
            "the keys of spec.tracking",
        )
        _check_defaults(
            PriceTable, self.prices, "prices (Helm pricing)", "the keys of pricing in values.yaml"
        )
        for namespace, entry in self.namespace_budgets.items():
            setting = f"namespace_budgets[{namespace!r}] (Helm budgets.namespaces)"
            if not isinstance(entry, Mapping):
                raise SettingsError(
                    f"{setting} is {entry!r}: give an object with default, maxGpuHours, maxAmount"
                )
            _check_defaults(
                NamespaceBudget, entry, setting, "default (a spec.budget), maxGpuHours and maxAmount"
            )
            budget = NamespaceBudget.model_validate(dict(entry))
            if not self.prices and (budget.max_amount or (budget.default and budget.default.amount)):
                # Nothing could count an amount: every job of the namespace would be held.
                raise SettingsError(
                    f"{setting} limits an amount, but no prices are set (Helm pricing): set pricing, or limit "
                    "GPU-hours only (maxGpuHours, default.gpuHours)"
                )
        if self.resync_seconds <= 0:
            raise SettingsError(f"resync_seconds must be > 0, got {self.resync_seconds}: use e.g. 30")
        if not 0 <= self.child_event_batch_seconds <= 10:
            raise SettingsError(
                f"child_event_batch_seconds must be between 0 and 10, got {self.child_event_batch_seconds}: "
                "use e.g. 0.5 (0 reconciles a job on every change of its children)"
            )
        if not 0 <= self.volume_wait_reported_seconds <= 600:
            raise SettingsError(
                f"volume_wait_reported_seconds must be between 0 and 600, got {self.volume_wait_reported_seconds}: "
                "use e.g. 30 (0 says at once that a new gang waits for its claim to be bound)"
            )
        if self.workers < 1:
            raise SettingsError(f"workers must be >= 1, got {self.workers}")
        if not 0 <= self.http_port <= 65535:
            raise SettingsError(f"http_port must be 0..65535, got {self.http_port}")
        trainer_ports = {"master_port": self.master_port, "weight_sync_port": self.weight_sync_port}
        trainer_ports["trainer_metrics_port"] = self.trainer_metrics_port
        for name, port in {**trainer_ports, "vllm_port": self.vllm_port}.items():
            if not 1 <= port <= 65535:
                raise SettingsError(f"{name} ({ENV_PREFIX}{name.upper()}) must be 1..65535, got {port}")
        if len(set(trainer_ports.values())) < len(trainer_ports):
            # All three are bound by trainer rank 0: the second bind would fail at run time.
            raise SettingsError(
                "master_port, weight_sync_port and trainer_metrics_port are all bound by trainer rank 0 and "
                f"must differ, got {trainer_ports}: change one of them"
            )
        if self.all_namespaces and self.namespaces:
            raise SettingsError(
                "watch either all namespaces or a list of namespaces, not both: "
                "drop --all-namespaces or the --namespace flags"
            )
        if self.pod_security not in POD_SECURITY_LEVELS:
            raise SettingsError(
                f"pod_security ({ENV_PREFIX}POD_SECURITY, Helm: jobDefaults.podSecurity.level) is "
                f"{self.pod_security!r}: use one of {', '.join(POD_SECURITY_LEVELS)}"
            )
        self._check_fast_network()
        for name in ("pod_run_as_user", "pod_run_as_group", "pod_fs_group"):
            value = getattr(self, name)
            if not 0 < value <= MAX_ID:
                raise SettingsError(
                    f"{name} ({ENV_PREFIX}{name.upper()}) is {value}: use a non-root id 1..{MAX_ID}, e.g. 65532"
                )
        if self.model_cache_claim and not _DNS1123_SUBDOMAIN.fullmatch(self.model_cache_claim):
            raise SettingsError(
                f"model_cache_claim ({ENV_PREFIX}MODEL_CACHE_CLAIM, Helm: jobDefaults.modelCacheClaim) "
                f"{self.model_cache_claim!r} is not a PersistentVolumeClaim name: use lower-case letters, digits, "
                "'-' and '.', or leave it empty"
            )
        scrapers = {
            "metrics_scrapers": ("generation", self.metrics_scrapers),
            "trainer_metrics_scrapers": ("trainer", self.trainer_metrics_scrapers),
        }
        for setting, (role, peers) in scrapers.items():
            for index, peer in enumerate(peers):
                problem = peer_problem(peer)
                if not problem:
                    continue
                # Caught here, at start-up: a peer the API server rejects (or reads as broader than
                # meant) would otherwise go into every job's NetworkPolicy.
                raise SettingsError(
                    f"{setting}[{index}] ({ENV_PREFIX}{setting.upper()}, Helm: "
                    f"metrics.podMonitors.{role}.allowFrom) {problem}: give each entry as a "
                    'NetworkPolicyPeer, e.g. {"namespaceSelector": {"matchLabels": '
                    '{"kubernetes.io/metadata.name": "monitoring"}}, "podSelector": '
                    '{"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}'
                )

        for index, requirement in enumerate(self.gpu_node_affinity):
            problem = requirement_problem(requirement)
            if problem:
                # Caught at start-up: the API server would refuse every GPU pod with it.
                raise SettingsError(
                    f"gpu_node_affinity[{index}] ({ENV_PREFIX}GPU_NODE_AFFINITY, Helm: jobDefaults.gpuNodeAffinity) "
                    f"{problem}: give each entry as a NodeSelectorRequirement, e.g. "
                    '{"key": "nvidia.com/cuda.driver-version.major", "operator": "Gt", "values": ["579"]}'
                )
        images = {
            "trainer_image": ("trainer", self.trainer_image),
            "vllm_image": ("generation", self.vllm_image),
        }
        for setting, (role, image) in images.items():
            if not image or any(c.isspace() for c in image):
                raise SettingsError(
                    f"{setting} ({ENV_PREFIX}{setting.upper()}, Helm: jobDefaults.images.{role}) is {image!r}: "
                    "give an image reference without spaces, e.g. registry.example.com/grpo/trainer:0.1.0"
                )
            prefixes = self.allowed_image_prefixes
            if prefixes and not any(image_allowed(image, prefix) for prefix in prefixes):
                # Every job that leaves the image unset would be refused (PolicyViolation).
                raise SettingsError(
                    f"{setting} {image!r} (Helm: jobDefaults.images.{role}) is not under allowed_image_prefixes "
                    f"{list(prefixes)} (Helm: platformPolicy.allowedImagePrefixes), so every job that leaves "
                    f"spec.{role}.image unset would be refused: set jobDefaults.images.{role} to your registry's "
                    "copy, or allow its registry"
                )
        if self.max_gpus_per_job < 0:
            raise SettingsError(
                f"max_gpus_per_job must be >= 0 (0: no limit), got {self.max_gpus_per_job} "
                f"({ENV_PREFIX}MAX_GPUS_PER_JOB, Helm: platformPolicy.maxGpusPerJob)"
            )
        for entry in self.gpu_resource_names:
            if not entry or "*" in entry[:-1] or entry == "*":
                # A "*" inside a name would silently match nothing; a lone "*" would count CPU and memory.
                raise SettingsError(
                    f"gpu_resource_names ({ENV_PREFIX}GPU_RESOURCE_NAMES, Helm: platformPolicy.gpuResourceNames) "
                    f"has {entry!r}: give resource names (nvidia.com/gpu) or prefixes ending in '*' "
                    "(nvidia.com/mig-*), with '*' only at the end"
                )
        default_queue, allowed_queues = self.default_queue_name, self.allowed_queue_names
        if default_queue and allowed_queues and default_queue not in allowed_queues:
            raise SettingsError(
                f"default_queue_name {default_queue!r} is not in allowed_queue_names "
                f"{list(allowed_queues)}: add it there (Helm: {self.limit_name('queue.allowed')}) "
                "or pick one of them as the default"
            )
        _check_teams(self)

    def _check_fast_network(self) -> None:
        """The fast-network settings, refused at start-up unless every job pod could carry them."""
        for name, (helm_key, problem) in NETWORK_SETTINGS.items():
            value: Any = getattr(self, name)
            where = f"{name} ({ENV_PREFIX}{name.upper()}, Helm: jobDefaults.fastNetwork.{helm_key})"
            if not isinstance(value, Mapping):
                raise SettingsError(f"{where} is not an object: give it as a JSON object of names to values")
            for key, raw in value.items():
                text = scalar(raw)
                found = "a value that is not a string or number" if text is None else problem(key, text)
                if found:
                    raise SettingsError(f"{where} has {key!r}: {found}")
            # Kept as strings: Helm renders a number in the values as a JSON number.
            object.__setattr__(self, name, {key: scalar(raw) for key, raw in value.items()})
        gpus = [key for key in self.network_resources if self.is_gpu_resource(key)]
        if gpus:
            raise SettingsError(
                f"network_resources ({ENV_PREFIX}NETWORK_RESOURCES, Helm: jobDefaults.fastNetwork.resources) "
                f"names the GPU resource {gpus[0]!r}: GPUs are requested by each job (spec.*.gpus); leave it out"
            )
        if self.ipc_lock and self.pod_security != "privileged":
            raise SettingsError(
                f"ipc_lock ({ENV_PREFIX}IPC_LOCK, Helm: jobDefaults.fastNetwork.ipcLock) adds the IPC_LOCK "
                f"capability to trainer and vLLM pods, which the {self.pod_security!r} Pod Security Standard "
                "forbids (restricted allows adding only NET_BIND_SERVICE, baseline a list without IPC_LOCK), so "
                f"tenant namespaces would refuse every job pod: set pod_security ({ENV_PREFIX}POD_SECURITY, Helm: "
                "jobDefaults.podSecurity.level) to 'privileged' and label the tenant namespaces "
                "pod-security.kubernetes.io/enforce=privileged, or turn ipc_lock off and raise the nodes' "
                "memlock limit instead (docs/platform.md, Fast networks)"
            )
        if self.pod_security == "privileged" and not self.ipc_lock:
            raise SettingsError(
                f"pod_security ({ENV_PREFIX}POD_SECURITY, Helm: jobDefaults.podSecurity.level) is 'privileged' "
                f"but ipc_lock ({ENV_PREFIX}IPC_LOCK, Helm: jobDefaults.fastNetwork.ipcLock) is off, and nothing "
                "else needs the privileged standard: use 'baseline' (pods run as the image's own user) or "
                "'restricted', or turn ipc_lock on"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: Any) -> OperatorSettings:
        """Settings from ``GRPO_OPERATOR_*`` variables, then ``overrides`` (command-line flags) on top."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = environ.get(ENV_PREFIX + f.name.upper())
            if raw is not None:
                values[f.name] = _parse(f.name, f.type, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def limit_name(self, key: str) -> str:
        """The Helm value of platform limit ``key`` ("maxGpusPerJob", "queue.allowed") for these settings."""
        return self.policy_sources.get(key, f"platformPolicy.{key}")

    def for_namespace(self, namespace: str) -> OperatorSettings:
        """The settings of jobs in ``namespace``: these, with its team's values in their place."""
        cache: dict[str, OperatorSettings] = self.__dict__.setdefault("_team_settings", {})
        if namespace not in cache:
            cache[namespace] = _team_settings(self, namespace)
        return cache[namespace]

    @property
    def price_table(self) -> PriceTable | None:
        """The platform's prices; None when it sets none."""
        return PriceTable.model_validate(dict(self.prices)) if self.prices else None

    def namespace_budget(self, namespace: str) -> NamespaceBudget | None:
        """What the platform sets for the jobs of ``namespace`` (its own entry, else "*"'s)."""
        entry = self.namespace_budgets.get(namespace, self.namespace_budgets.get("*"))
        return NamespaceBudget.model_validate(dict(entry)) if entry else None

    @property
    def clusterwide(self) -> bool:
        return self.all_namespaces or not self.namespaces

    def is_gpu_resource(self, name: str) -> bool:
        """Whether a container resource named ``name`` is a GPU for max_gpus_per_job."""
        if name == self.gpu_resource:
            return True
        return any(
            name.startswith(entry[:-1]) if entry.endswith("*") else name == entry
            for entry in self.gpu_resource_names
        )


def _parse(name: str, type_name: Any, raw: str) -> Any:
    """Parses one environment value by the field's annotation (a string under PEP 563)."""
    text = str(type_name)
    env = ENV_PREFIX + name.upper()
    try:
        if text == "bool":
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if text == "int":
            return int(raw)
        if text == "float":
            return float(raw)
        if text == "str":
            return raw
        if text == "tuple[str, ...]":
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        if text == "tuple[int, ...]":
            return tuple(int(part) for part in raw.split(",") if part.strip())
        # Mappings and lists of mappings are given as JSON.
        parsed = json.loads(raw)
        if text.startswith("tuple"):
            if not isinstance(parsed, list):
                raise ValueError("expected a JSON list")
            return tuple(parsed)
        if not isinstance(parsed, dict):
            raise ValueError("expected a JSON object")
        return parsed
    except ValueError as exc:
        raise SettingsError(f"{env}={raw!r} is not a valid {text} ({exc})") from None


def _team_settings(settings: OperatorSettings, namespace: str) -> OperatorSettings:
    for team in parse_teams(settings.team_policies):
        if namespace not in team.namespaces:
            continue
        values, sources = team.overrides()
        budgets = dict(settings.namespace_budgets)
        if team.budget is not None:
            budgets[namespace] = team.budget.model_dump(by_alias=True, exclude_none=True)
        try:
            return dataclasses.replace(
                settings, team_policies=(), policy_sources=sources, namespace_budgets=budgets, **values
            )
        except SettingsError as exc:
            raise SettingsError(f"team {team.name} (Helm teams): {exc}") from None
    return settings


def _check_teams(settings: OperatorSettings) -> None:
    """Each team valid, no namespace in two teams, and each team's settings valid once applied (its default
    images under its allowed prefixes, its queue default among its allowed queues, ...)."""
    where = f"team_policies ({ENV_PREFIX}TEAM_POLICIES, Helm teams)"
    try:
        teams = parse_teams(settings.team_policies)
    except ValidationError as exc:
        raise SettingsError(f"{where} is not valid: {'; '.join(describe_validation_error(exc))}") from None
    except ValueError as exc:
        raise SettingsError(f"{where}: {exc}") from None
    for team in teams:
        _team_settings(settings, team.namespaces[0])


def _check_defaults(model: type[BaseModel], value: Mapping[str, Any], setting: str, use: str) -> None:
    """A platform default that is part of a job's spec, refused at start unless it validates as that part."""
    if not value:
        return
    try:
        model.model_validate(dict(value))
    except ValidationError as exc:
        raise SettingsError(
            f"{setting} is not valid: {'; '.join(describe_validation_error(exc))}; use {use}"
        ) from None
