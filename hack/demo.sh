#!/usr/bin/env bash
# `make demo`: the whole path on one machine, no GPU and no Docker.
#   1. a local Kubernetes control plane with simulated 8-GPU nodes (hack/cluster.sh)
#   2. the GRPOJob CRD, and the operator running as a local process against that cluster
#   3. examples/tiny/grpojob.yaml applied; `kubectl get grpo` followed until the job is Running
# Safe to rerun and to interrupt: the job is recreated, the operator process is stopped on exit.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
NS="${DEMO_NAMESPACE:-grpo-demo}"
JOB_FILE="${DEMO_JOB:-examples/tiny/grpojob.yaml}"
WORK="${DEMO_WORKDIR:-$HOME/.cache/grpo-demo}"
mkdir -p "$WORK"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "Local cluster (real kube-apiserver/etcd/controller-manager/scheduler, kwok GPU nodes)"
eval "$(bash hack/cluster.sh up)"
kubectl get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.count

say "GRPOJob CRD"
kubectl apply --server-side --force-conflicts -f crds/ >/dev/null
kubectl wait --for=condition=Established crd/grpojobs.grpo.dev --timeout=60s >/dev/null
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null

say "Operator (local process; log: $WORK/operator.log)"
OPERATOR_PID=""
cleanup() {
  if [ -n "$OPERATOR_PID" ] && kill -0 "$OPERATOR_PID" 2>/dev/null; then
    kill "$OPERATOR_PID" 2>/dev/null || true
    wait "$OPERATOR_PID" 2>/dev/null || true
  fi
}
trap cleanup EXIT INT TERM
grpo-operator run --namespace "$NS" >"$WORK/operator.log" 2>&1 &
OPERATOR_PID=$!
sleep 2
kill -0 "$OPERATOR_PID" 2>/dev/null || { cat "$WORK/operator.log"; echo "operator failed to start" >&2; exit 1; }

JOB="$(python3 -c 'import sys,yaml; print(yaml.safe_load(open(sys.argv[1]))["metadata"]["name"])' "$JOB_FILE")"
say "Apply $JOB_FILE (job '$JOB' in namespace '$NS')"
# A rerun starts from scratch: delete a job left from an earlier run and wait for its children to go.
kubectl delete grpojob "$JOB" -n "$NS" --ignore-not-found --wait=true --timeout=120s >/dev/null
kubectl apply -n "$NS" -f "$JOB_FILE"

say "kubectl get grpo -n $NS  (until Running)"
deadline=$((SECONDS + 180))
last=""
while :; do
  out="$(kubectl get grpo "$JOB" -n "$NS" 2>/dev/null || true)"
  if [ "$out" != "$last" ]; then echo "$out"; last="$out"; fi
  phase="$(kubectl get grpo "$JOB" -n "$NS" -o jsonpath='{.status.phase}' 2>/dev/null || true)"
  [ "$phase" = "Running" ] && break
  if [ "$phase" = "Failed" ] || [ $SECONDS -gt $deadline ]; then
    kubectl describe grpo "$JOB" -n "$NS" || true
    echo "demo: job did not reach Running (phase '$phase'); operator log: $WORK/operator.log" >&2
    exit 1
  fi
  sleep 1
done

say "What the operator created"
kubectl get pods,svc,pvc,configmap,deploy -n "$NS" -l grpo.dev/job="$JOB" -o wide
kubectl get grpo -n "$NS" -o wide
say "Events"
kubectl get events -n "$NS" --field-selector involvedObject.kind=GRPOJob --sort-by=.lastTimestamp | tail -n 10
echo
echo "Done. The cluster stays up: export KUBECONFIG=$KUBECONFIG ; stop it with: make cluster-down"
