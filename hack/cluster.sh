#!/usr/bin/env bash
# Local Kubernetes control plane with simulated NVIDIA GPU nodes, built from the binaries that
# hack/testbins.sh compiles. Real kube-apiserver, etcd, kube-controller-manager and kube-scheduler;
# kwok simulates the kubelets (nodes, pod lifecycles). No Docker, no downloads.
#
#   hack/cluster.sh up        start (idempotent; a stale cluster from a killed run is replaced)
#   hack/cluster.sh down      stop and remove all state
#   hack/cluster.sh status    exit 0 if the cluster answers
#   hack/cluster.sh env       print `export KUBECONFIG=...; export PATH=...`
#   hack/cluster.sh up --kueue   also run Kueue's controller manager (same as GRPO_KUEUE=1)
#   hack/cluster.sh kueue     start Kueue in the running cluster (idempotent; see docs/kueue.md)
#
# Environment: GRPO_CLUSTER_NAME (default grpo), GRPO_CLUSTER_HOME (default ~/.cache/grpo-cluster),
# GPU_NODES (default 2), GPUS_PER_NODE (default 8), CPU_NODES (default 1), GRPO_TESTBINS,
# GRPO_KWOK_STAGES (kwok's pod and node stages; default hack/cluster/kwok-stages.yaml, where generation pods
# wait for whatever runs vLLM to report them Ready; empty: kwok's own, every pod Ready once scheduled).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
# shellcheck source=hack/versions.env
source "$HERE/versions.env"

BINS="${GRPO_TESTBINS:-$HOME/.cache/grpo-testbins}"
K8S_BIN="$BINS/k8s-$K8S_VERSION"
ETCD_BIN="$BINS/etcd-$ETCD_VERSION"
KWOK_BIN="$BINS/kwok-$KWOK_VERSION"
HELM_BIN="$BINS/helm-$HELM_VERSION"
KUEUE_BIN="$BINS/kueue-$KUEUE_VERSION"
NAME="${GRPO_CLUSTER_NAME:-grpo}"
export KWOK_WORKDIR="${GRPO_CLUSTER_HOME:-$HOME/.cache/grpo-cluster}"
STATE="$KWOK_WORKDIR/clusters/$NAME"
KUBECONFIG_OUT="$KWOK_WORKDIR/$NAME.kubeconfig"
EXTRA="$KWOK_WORKDIR/$NAME.extra"          # our own state beside kwokctl's: provisioner pid, volumes
GPU_NODES="${GPU_NODES:-2}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
CPU_NODES="${CPU_NODES:-1}"
STAGES="${GRPO_KWOK_STAGES-$HERE/cluster/kwok-stages.yaml}"
# The control plane's own settings (kube-controller-manager's client rate): see the file.
COMPONENTS="$HERE/cluster/components.yaml"
# kwok's Logs objects, created at run time: whatever runs a pod's process locally (the test harness's
# runner) names its log file in one, and kwok serves it to `kubectl logs` as a kubelet would.
KWOK_CRDS="Logs"
export PATH="$K8S_BIN:$KWOK_BIN:$HELM_BIN:$PATH"   # kwokctl takes kubectl from PATH: ours first

log() { printf '[cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
kc() { kubectl --kubeconfig "$KUBECONFIG_OUT" "$@"; }
# kubectl wait fails at once (instead of waiting) on a CRD created a moment ago that has no
# status.conditions yet: retry it for up to a minute.
wait_established() {
  local i
  for i in $(seq 1 60); do
    kc wait --for=condition=Established crd --all --timeout=30s >/dev/null 2>&1 && return 0
    sleep 1
  done
  kc wait --for=condition=Established crd --all --timeout=5s >/dev/null
}

# Which stages and component settings a cluster is created with: the files' hashes, recorded in $EXTRA at
# creation.
stages_id() {
  if [ -n "$STAGES" ]; then sha256sum "$STAGES" | cut -d' ' -f1; else echo "kwok-defaults"; fi
  echo "crds: $KWOK_CRDS"
  echo "components: $(sha256sum "$COMPONENTS" | cut -d' ' -f1)"
}

# The stages of the running cluster (kwok reads them only at creation). A cluster without the record was
# created before the stage file existed, with kwok's defaults.
running_stages_id() {
  cat "$EXTRA/stages.sha256" 2>/dev/null || echo "kwok-defaults"
}

answers() {
  [ -f "$KUBECONFIG_OUT" ] && kc --request-timeout=3s get --raw /readyz >/dev/null 2>&1
}

need_bins() {
  local missing=0
  for d in "$K8S_BIN" "$ETCD_BIN" "$KWOK_BIN"; do [ -f "$d/.ready" ] || missing=1; done
  if [ "$missing" -eq 1 ]; then
    log "control-plane binaries missing; building them (cold: tens of minutes, see docs/development.md)"
    bash "$HERE/testbins.sh" etcd kwok k8s
  fi
}

provisioner_running() {
  [ -f "$EXTRA/provisioner.pid" ] && kill -0 "$(cat "$EXTRA/provisioner.pid")" 2>/dev/null
}

start_provisioner() {
  provisioner_running && return 0
  mkdir -p "$EXTRA/volumes"
  local py="${PYTHON:-python3}"
  [ -x "$REPO/.venv/bin/python" ] && py="$REPO/.venv/bin/python"
  nohup "$py" "$HERE/cluster/provisioner.py" --kubeconfig "$KUBECONFIG_OUT" --root "$EXTRA/volumes" \
    >"$EXTRA/provisioner.log" 2>&1 &
  echo $! >"$EXTRA/provisioner.pid"
  log "volume provisioner started (pid $(cat "$EXTRA/provisioner.pid"), log $EXTRA/provisioner.log)"
}

stop_provisioner() {
  if provisioner_running; then kill "$(cat "$EXTRA/provisioner.pid")" 2>/dev/null || true; fi
  rm -f "$EXTRA/provisioner.pid"
}

kueue_running() {
  [ -f "$EXTRA/kueue.pid" ] && kill -0 "$(cat "$EXTRA/kueue.pid")" 2>/dev/null
}

# Below the kernel's ephemeral range, so no outgoing connection takes it before Kueue binds it (tests/harness/ports.py).
free_port() { PYTHONPATH="$REPO" python3 -c 'from tests.harness.ports import free_port; print(free_port())'; }

# Kueue's controller manager as a local process: its webhooks are served on 127.0.0.1 with a
# self-signed certificate, and the API server calls them by URL (hack/cluster/kueue_manifests.py).
# Only the "pod" integration is on, for namespaces labelled kueue-managed=true.
kueue_up() {
  local t0=$SECONDS
  answers || { log "cluster '$NAME' is not running: start it with 'hack/cluster.sh up --kueue'"; return 1; }
  if kueue_running; then log "kueue is already running in cluster '$NAME'"; return 0; fi
  [ -f "$KUEUE_BIN/.ready" ] || bash "$HERE/testbins.sh" kueue >/dev/null
  local dir="$EXTRA/kueue" py="${PYTHON:-python3}" webhook_port health_port metrics_port
  [ -x "$REPO/.venv/bin/python" ] && py="$REPO/.venv/bin/python"
  rm -rf "$dir"; mkdir -p "$dir/certs"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=127.0.0.1" \
    -addext "subjectAltName=IP:127.0.0.1" -keyout "$dir/certs/tls.key" -out "$dir/certs/tls.crt" 2>/dev/null
  webhook_port="$(free_port)"; health_port="$(free_port)"; metrics_port="$(free_port)"
  cat >"$dir/config.yaml" <<YAML
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health: {healthProbeBindAddress: "127.0.0.1:$health_port"}
metrics: {bindAddress: "127.0.0.1:$metrics_port"}
webhook: {host: 127.0.0.1, port: $webhook_port, certDir: "$dir/certs"}
leaderElection: {leaderElect: false}
internalCertManagement: {enable: false}
manageJobsWithoutQueueName: false
managedJobsNamespaceSelector: {matchLabels: {kueue-managed: "true"}}
integrations: {frameworks: ["pod"]}
# The on-demand visibility API needs an APIService in front of it; nothing here uses it.
featureGates: {VisibilityOnDemand: false}
YAML
  kc create namespace kueue-system --dry-run=client -o yaml | kc apply -f - >/dev/null
  "$py" "$HERE/cluster/kueue_manifests.py" "$KUEUE_BIN" "$webhook_port" "$dir/certs/tls.crt" \
    | kc apply --server-side --force-conflicts -f - >/dev/null
  wait_established
  KUBECONFIG="$KUBECONFIG_OUT" KUEUE_METRICS_CERT_DIR="$dir/certs" nohup "$KUEUE_BIN/kueue" \
    --config "$dir/config.yaml" >"$EXTRA/kueue.log" 2>&1 &
  echo $! >"$EXTRA/kueue.pid"
  # Ready when the manager answers /readyz and its webhooks admit a Kueue object (server dry run).
  local i
  for ((i = 0; i < 120; i++)); do
    if ! kueue_running; then log "kueue exited; its log ($EXTRA/kueue.log):"; tail -20 "$EXTRA/kueue.log" >&2; return 1; fi
    if curl -sf "http://127.0.0.1:$health_port/readyz" >/dev/null 2>&1 \
      && printf 'apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata: {name: probe}\n' \
        | kc apply --dry-run=server -f - >/dev/null 2>&1; then
      log "kueue $KUEUE_VERSION ready in $((SECONDS - t0))s (pid $(cat "$EXTRA/kueue.pid"), webhooks on 127.0.0.1:$webhook_port, log $EXTRA/kueue.log)"
      return 0
    fi
    sleep 1
  done
  log "kueue did not become ready in 120s; its log ($EXTRA/kueue.log):"; tail -20 "$EXTRA/kueue.log" >&2
  return 1
}

stop_kueue() {
  if kueue_running; then
    local pid; pid="$(cat "$EXTRA/kueue.pid")"
    kill "$pid" 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  fi
  rm -f "$EXTRA/kueue.pid"
}

nodes_yaml() {
  local i
  for ((i = 0; i < GPU_NODES; i++)); do
    cat <<YAML
---
apiVersion: v1
kind: Node
metadata:
  name: gpu-node-$i
  annotations: {node.alpha.kubernetes.io/ttl: "0", kwok.x-k8s.io/node: fake}
  labels:
    kubernetes.io/hostname: gpu-node-$i
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    node.kubernetes.io/instance-type: sim-8xh100
    nvidia.com/gpu.present: "true"
    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
    nvidia.com/gpu.count: "$GPUS_PER_NODE"
    nvidia.com/gpu.memory: "81559"
    type: kwok
spec:
  taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
status:
  capacity: {cpu: "192", memory: 2Ti, pods: "110", ephemeral-storage: 4Ti, nvidia.com/gpu: "$GPUS_PER_NODE"}
  allocatable: {cpu: "192", memory: 2Ti, pods: "110", ephemeral-storage: 4Ti, nvidia.com/gpu: "$GPUS_PER_NODE"}
YAML
  done
  for ((i = 0; i < CPU_NODES; i++)); do
    cat <<YAML
---
apiVersion: v1
kind: Node
metadata:
  name: cpu-node-$i
  annotations: {node.alpha.kubernetes.io/ttl: "0", kwok.x-k8s.io/node: fake}
  labels:
    kubernetes.io/hostname: cpu-node-$i
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
status:
  capacity: {cpu: "64", memory: 256Gi, pods: "110", ephemeral-storage: 1Ti}
  allocatable: {cpu: "64", memory: 256Gi, pods: "110", ephemeral-storage: 1Ti}
YAML
  done
}

up() {
  local t0=$SECONDS
  need_bins
  if answers && [ "$(running_stages_id)" != "$(stages_id)" ]; then
    # A developer's cluster outlives test runs, and kwok reads its stages only when the cluster is created:
    # one made before the stage file last changed (or without it) would keep the old pod lifecycle, e.g.
    # generation pods Ready at once, which the tests of vLLM's start-up no longer expect.
    log "cluster '$NAME' was created with other kwok stages or component settings; recreating it"
    down
  fi
  if answers; then
    log "cluster '$NAME' is already running"
    start_provisioner
    if [ "$WITH_KUEUE" = 1 ]; then kueue_up; fi
    env_lines
    return 0
  fi
  if [ -d "$STATE" ] || [ -f "$KUBECONFIG_OUT" ]; then
    log "found a stale cluster '$NAME' (not answering); removing it first"
    down
  fi
  log "starting cluster '$NAME' (kube $K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION)"
  mkdir -p "$EXTRA" "$KWOK_WORKDIR"
  # kwokctl picks each component's port by finding a free one, then starts the component later: two clusters
  # created at once (the test workers each start one) can pick the same port, and one cluster's kwokctl
  # then talks to the other's API server (x509: certificate signed by unknown authority). Creations take
  # turns, machine-wide; a creation that fails anyway is cleaned up and tried once more.
  exec 8>"$KWOK_WORKDIR/create.lock"
  flock 8
  if ! create_cluster; then
    log "creating cluster '$NAME' failed; removing what was made and trying once more"
    down
    mkdir -p "$EXTRA"
    create_cluster
  fi
  flock -u 8
  exec 8>&-
  stages_id >"$EXTRA/stages.sha256"
  nodes_yaml | kc apply -f - >/dev/null
  kc apply -f "$HERE/cluster/storage.yaml" >/dev/null
  start_provisioner
  # kwok marks the nodes Ready one status update at a time: about 4 s per 1,000 nodes on a quiet machine,
  # minutes on a busy one (1,036 nodes did not make 60 s).
  kc wait --for=condition=Ready node --all --timeout="$((60 + (GPU_NODES + CPU_NODES) / 4))s" >/dev/null
  log "cluster '$NAME' up in $((SECONDS - t0))s: $GPU_NODES GPU node(s) x $GPUS_PER_NODE nvidia.com/gpu, $CPU_NODES CPU node(s)"
  if [ "$WITH_KUEUE" = 1 ]; then kueue_up; fi
  env_lines
}

create_cluster() {
  kwokctl create cluster --name "$NAME" --runtime binary \
    --kube-apiserver-binary "$K8S_BIN/kube-apiserver" \
    --kube-controller-manager-binary "$K8S_BIN/kube-controller-manager" \
    --kube-scheduler-binary "$K8S_BIN/kube-scheduler" \
    --etcd-binary "$ETCD_BIN/etcd" \
    --kwok-controller-binary "$KWOK_BIN/kwok" \
    --kubeconfig "$KUBECONFIG_OUT" \
    ${STAGES:+--config "$STAGES"} \
    --config "$COMPONENTS" \
    --enable-crds "$KWOK_CRDS" \
    --wait 120s >&2
}

down() {
  stop_kueue
  stop_provisioner
  if [ -d "$STATE" ]; then
    kwokctl delete cluster --name "$NAME" --kubeconfig "$KUBECONFIG_OUT" >&2 || true
  fi
  rm -rf "$STATE" "$EXTRA" "$KUBECONFIG_OUT"
  log "cluster '$NAME' removed"
}

env_lines() {
  echo "export KUBECONFIG=$KUBECONFIG_OUT"
  echo "export PATH=$K8S_BIN:$HELM_BIN:\$PATH"
}

WITH_KUEUE="${GRPO_KUEUE:-0}"
[ "${2:-}" = "--kueue" ] && WITH_KUEUE=1
case "${1:-}" in
  up) up ;;
  kueue) kueue_up ;;
  down) down ;;
  status) answers ;;
  env) env_lines ;;
  *) echo "usage: $0 up [--kueue]|down|status|env|kueue" >&2; exit 2 ;;
esac
