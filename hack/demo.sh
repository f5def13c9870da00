#!/usr/bin/env bash
# `make demo`: the whole path on one machine, no GPU and no Docker.
#   1. a local Kubernetes control plane with simulated 8-GPU nodes (hack/cluster.sh)
#   2. the GRPOJob CRD, and the operator running as a local process against that cluster
#   3. examples/tiny/grpojob.yaml applied; `kubectl get grpo` followed until its pods are placed and
#      started (the job waits for its vLLM pod to become Ready; kwok leaves that to the local runner)
#   4. simulated nodes run no containers, so the test harness's local runner
#      (tests/harness/local_runner.py) runs the job's metric server, its vLLM server (PyPI's CPU build of
#      vLLM, with the pod's own args) and its trainer as local processes, wired as their pods would be,
#      and mirrors their exits into the pods' status
#   5. the job trains a tiny model for real (CPU) to Succeeded; it ends with `kubectl grpo status`, a few
#      samples, the checkpoints and a reward-curve PNG (the kubectl plugin)
# Safe to rerun and to interrupt: the job is recreated, local processes are stopped on exit.
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
for _ in $(seq 1 60); do kubectl wait --for=condition=Established crd/grpojobs.grpo.dev --timeout=30s >/dev/null 2>&1 && break; sleep 1; done
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null

say "Operator (local process; log: $WORK/operator.log)"
OPERATOR_PID=""
WATCH_PID=""
cleanup() {
  for pid in $WATCH_PID $OPERATOR_PID; do
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
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

say "kubectl get grpo -n $NS  (until its pods start; Running once vLLM answers, in the training below)"
deadline=$((SECONDS + 180))
last=""
while :; do
  out="$(kubectl get grpo "$JOB" -n "$NS" 2>/dev/null || true)"
  if [ "$out" != "$last" ]; then echo "$out"; last="$out"; fi
  phase="$(kubectl get grpo "$JOB" -n "$NS" -o jsonpath='{.status.phase}' 2>/dev/null || true)"
  # Initializing: every pod is placed and started, and the job waits for its vLLM pod to become Ready,
  # which only a vLLM server answering /health makes it (the local runner's, started below).
  case "$phase" in Initializing | Running) break ;; esac
  if [ "$phase" = "Failed" ] || [ $SECONDS -gt $deadline ]; then
    kubectl describe grpo "$JOB" -n "$NS" || true
    echo "demo: the job's pods did not start (phase '$phase'); operator log: $WORK/operator.log" >&2
    exit 1
  fi
  sleep 1
done

say "What the operator created"
kubectl get pods,svc,pvc,configmap,deploy -n "$NS" -l grpo.dev/job="$JOB" -o wide
say "Events"
# Only this incarnation's events: a rerun's job has the same name but a new UID.
UID_="$(kubectl get grpo "$JOB" -n "$NS" -o jsonpath='{.metadata.uid}')"
kubectl get events -n "$NS" --field-selector "involvedObject.uid=$UID_" --sort-by=.lastTimestamp | tail -n 10

if [ "${DEMO_TRAIN:-1}" = "0" ]; then
  echo; echo "DEMO_TRAIN=0: stopping before vLLM starts. The cluster stays up: export KUBECONFIG=$KUBECONFIG"
  exit 0
fi

VOLUME="$(kubectl get pv "$(kubectl get pvc "$JOB-ckpt" -n "$NS" -o jsonpath='{.spec.volumeName}')" \
  -o jsonpath='{.spec.hostPath.path}')"
say "Seed the job's volume ($VOLUME = /workspace in the pods): tiny model + prompts"
python examples/tiny/seed.py "$VOLUME"

say "vLLM for the generation pod: PyPI's CPU build (installed once into ~/.cache/grpo-vllm, ~1 GB)"
bash hack/vllm-env.sh

say "Train: local runner plays the kubelet for the job's metric, vLLM and trainer pods (logs: $WORK/runner)"
echo "(vLLM takes 1-3 minutes to start on a small machine; the trainer waits for its /health)"
echo "(kubectl get grpo -w follows; the reward should rise as the steps go by)"
kubectl get grpo "$JOB" -n "$NS" -w --output-watch-events=false &
WATCH_PID=$!
# The vLLM pod's log as a user reads it (kwok serves the local server's log for the pod): kept from the
# first completion it served, for the summary; the pod, and with it its log, is gone once the job ends.
GEN_LOG="$WORK/generation-pod-log.txt"
(
  until kubectl-grpo logs "$JOB" -n "$NS" --role generation --tail 400 2>/dev/null >"$GEN_LOG.part" \
    && grep -q 'POST /v1/completions' "$GEN_LOG.part"; do sleep 5; done
  mv "$GEN_LOG.part" "$GEN_LOG"
) &
GEN_LOG_PID=$!
python -m tests.harness.run_local_job --namespace "$NS" --job "$JOB" --workdir "$WORK/runner" \
  --metric "ghcr.io/grpo-operator/metric-tiny-demo:0.1.0=python examples/tiny/metric.py" --timeout 1500
sleep 2
kill "$WATCH_PID" "$GEN_LOG_PID" 2>/dev/null || true

say "Result"
kubectl get grpo "$JOB" -n "$NS" -o wide
say "Generation: the vLLM server and the weight sync after every step"
python hack/demo_generation.py "$WORK/runner" "$VOLUME"
if [ -f "$GEN_LOG" ]; then
  echo "kubectl grpo logs $JOB -n $NS --role generation, while it served (last requests):"
  grep 'POST /v1/completions' "$GEN_LOG" | tail -n 3 | sed 's/^/  /'
fi
kubectl get grpo "$JOB" -n "$NS" -o jsonpath='{range .status.conditions[?(@.type=="ServedModelInSync")]}ServedModelInSync={.status} ({.reason}): {.message}{"\n"}{end}'
say "Learning health: the trainer's diagnosis at every step (docs/concepts.md, 'When a job does not learn')"
kubectl get grpo "$JOB" -n "$NS" -o jsonpath='{range .status.conditions[?(@.type=="LearningHealthy")]}LearningHealthy={.status} ({.reason}): {.message}{"\n"}{end}'
# A run that learns must never be diagnosed as not learning: the demo fails on a false alarm.
python - "$VOLUME/output/metrics.jsonl" <<'PY'
import collections, json, sys
reasons = [json.loads(line)["learning_health"] for line in open(sys.argv[1], encoding="utf-8")]
steps = collections.Counter(reasons)
print("per step:", ", ".join(f"{reason} x{count}" for reason, count in steps.items()))
unhealthy = sorted(set(reasons) - {"Healthy", "Solved"})
if unhealthy:
    sys.exit(f"demo: the learning-health diagnosis said {unhealthy} on a run that learns")
PY

# What a user reads with the kubectl plugin (kubectl-grpo, installed with the package). On a real cluster
# it reads the job's volume by exec-ing into a short-lived reader pod; simulated nodes run no containers,
# so here it reads the directory behind the claim's hostPath volume instead.
command -v kubectl-grpo >/dev/null || { echo "kubectl-grpo is not on PATH: run 'make venv'" >&2; exit 1; }
export KUBECTL_GRPO_VOLUME_ACCESS=hostpath
say "kubectl grpo status $JOB -n $NS"
kubectl grpo status "$JOB" -n "$NS"
say "kubectl grpo samples $JOB -n $NS --step 1 --limit 4   (the untrained model: a prompt, completions, rewards)"
kubectl grpo samples "$JOB" -n "$NS" --step 1 --limit 4
say "kubectl grpo samples $JOB -n $NS --limit 4   (the same view at the last step)"
kubectl grpo samples "$JOB" -n "$NS" --limit 4
say "kubectl grpo checkpoints $JOB -n $NS"
kubectl grpo checkpoints "$JOB" -n "$NS"
PNG="$WORK/reward-curve.png"
kubectl grpo rewards "$JOB" -n "$NS" --plot "$PNG" >/dev/null
echo
echo "Reward curve:       $PNG   (the table: kubectl grpo rewards $JOB -n $NS)"
echo "More:               kubectl grpo --help  (samples --worst, export --to DIR, logs, suspend/resume)"
echo
echo "Done. The cluster stays up: export KUBECONFIG=$KUBECONFIG KUBECTL_GRPO_VOLUME_ACCESS=hostpath ;"
echo "stop it with: make cluster-down"
