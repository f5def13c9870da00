#!/usr/bin/env bash
# Smoke test of a real GPU cluster: runs examples/smoke/grpojob.yaml through the whole production path
# and checks each part. Needs kubectl pointing at the cluster, the operator installed (Helm chart), the
# images of `make images` pullable, two free GPUs and a ReadWriteMany StorageClass. About 5-10 minutes.
#
#   bash examples/smoke/smoke.sh            # namespace grpo-smoke (created if missing)
#
# Environment:
#   SMOKE_NAMESPACE      namespace to run in (default grpo-smoke)
#   SMOKE_TIMEOUT        seconds each stage may take (default 900)
#   SMOKE_SKIP_METRICS=1 skip reading the trainer's /metrics through the API server's pod proxy
#                        (needs the pods/proxy permission)
#   SMOKE_KEEP=1         keep the job, its volume and the seed Job afterwards (default: delete them)
#
# Exit status 0 and "smoke: PASSED" when every check held; otherwise 1 and "smoke: FAILED: <why>".
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NS="${SMOKE_NAMESPACE:-grpo-smoke}"
TIMEOUT="${SMOKE_TIMEOUT:-900}"
JOB=smoke
K=(kubectl -n "$NS")

say() { printf '\n== %s\n' "$*"; }
fail() {
  echo "smoke: FAILED: $*" >&2
  echo "--- kubectl describe grpojob $JOB" >&2
  "${K[@]}" describe grpojob "$JOB" >&2 || true
  exit 1
}
field() { "${K[@]}" get grpojob "$JOB" -o jsonpath="{$1}" 2>/dev/null || true; }

# wait_until DESCRIPTION COMMAND...: runs COMMAND every 2 s until it succeeds; fails the smoke test on
# timeout or when the job has Failed.
wait_until() {
  local what="$1"
  shift
  local deadline=$((SECONDS + TIMEOUT))
  until "$@"; do
    [ "$(field .status.phase)" = "Failed" ] && fail "the job Failed while waiting for: $what ($(field .status.message))"
    [ $SECONDS -ge $deadline ] && fail "timed out after ${TIMEOUT}s waiting for: $what"
    sleep 2
  done
}

cleanup() {
  if [ "${SMOKE_KEEP:-0}" != "1" ]; then
    "${K[@]}" delete grpojob "$JOB" --ignore-not-found --wait=false >/dev/null 2>&1 || true
    "${K[@]}" delete job smoke-seed --ignore-not-found --cascade=background >/dev/null 2>&1 || true
    "${K[@]}" delete configmap smoke-seed --ignore-not-found >/dev/null 2>&1 || true
  fi
}

say "1/7 job $NS/$JOB, suspended until its volume is seeded"
kubectl get namespace "$NS" >/dev/null 2>&1 || kubectl create namespace "$NS" >/dev/null
"${K[@]}" delete grpojob "$JOB" --ignore-not-found --wait=true --timeout=300s >/dev/null
"${K[@]}" delete job smoke-seed --ignore-not-found --wait=true --timeout=120s >/dev/null
# A previous run's claim goes with its job (retention: Delete); let it go before the new job wants one.
"${K[@]}" wait --for=delete pvc/smoke-ckpt --timeout=300s >/dev/null 2>&1 || true
trap cleanup EXIT
"${K[@]}" create configmap smoke-seed --from-file=seed.py="$HERE/seed.py" --dry-run=client -o yaml |
  "${K[@]}" apply -f - >/dev/null
"${K[@]}" apply -f "$HERE/grpojob.yaml"
claim_bound() { [ "$("${K[@]}" get pvc smoke-ckpt -o jsonpath='{.status.phase}' 2>/dev/null)" = "Bound" ]; }
claim_exists() { "${K[@]}" get pvc smoke-ckpt >/dev/null 2>&1; }
wait_until "the operator to create the claim smoke-ckpt" claim_exists

say "2/7 seed the volume: a tiny model and prompts, written in the cluster (no model hub)"
"${K[@]}" apply -f "$HERE/seed-job.yaml"
seed_done() {
  [ "$("${K[@]}" get job smoke-seed -o jsonpath='{.status.succeeded}' 2>/dev/null)" = "1" ] && return 0
  if [ "$("${K[@]}" get job smoke-seed -o jsonpath='{.status.failed}' 2>/dev/null)" = "2" ]; then
    "${K[@]}" logs job/smoke-seed --tail=30 >&2 || true
    fail "the seed Job failed twice (its log is above)"
  fi
  return 1
}
wait_until "the seed Job to complete" seed_done
claim_bound || fail "claim smoke-ckpt is not Bound after the seed Job ran"
echo "seeded: $("${K[@]}" logs job/smoke-seed --tail=1 2>/dev/null || echo '(log not available)')"

say "3/7 resume the job: vLLM, trainer and metric service start"
"${K[@]}" patch grpojob "$JOB" --type=merge -p '{"spec":{"suspend":false}}' >/dev/null
running() { [ "$(field .status.phase)" = "Running" ]; }
wait_until "phase Running" running
"${K[@]}" get grpojob "$JOB" -o wide
metric_ready() { [ "$(field '.status.conditions[?(@.type=="MetricReady")].status')" = "True" ]; }
wait_until "the metric service to be ready (condition MetricReady)" metric_ready

say "4/7 wait for the first checkpoint"
has_checkpoint() { [ -n "$(field .status.checkpoint.lastStep)" ]; }
wait_until "status.checkpoint" has_checkpoint
CKPT_STEP="$(field .status.checkpoint.lastStep)"
CKPT_PATH="$(field .status.checkpoint.path)"
ATTEMPT="$(field .status.trainerAttempt)"
echo "checkpoint of step $CKPT_STEP at $CKPT_PATH (trainer attempt $ATTEMPT)"

say "5/7 delete the trainer pod; the job must restart and resume from that checkpoint"
POD="$JOB-trainer-$ATTEMPT-0"
"${K[@]}" delete pod "$POD" --wait=false
next_attempt() { [ "$(field .status.trainerAttempt)" -gt "$ATTEMPT" ] 2>/dev/null; }
wait_until "a new trainer attempt after deleting $POD" next_attempt
NEW_ATTEMPT="$(field .status.trainerAttempt)"
NEW_POD="$JOB-trainer-$NEW_ATTEMPT-0"
new_pod() { "${K[@]}" get pod "$NEW_POD" >/dev/null 2>&1; }
wait_until "pod $NEW_POD" new_pod
RESUME_FROM="$("${K[@]}" get pod "$NEW_POD" -o jsonpath='{.metadata.annotations.grpo\.dev/resume-from}')"
RESUME_STEP="${RESUME_FROM##*step-}"
echo "attempt $NEW_ATTEMPT resumes from: ${RESUME_FROM:-nothing}"
case "$RESUME_STEP" in
  '' | *[!0-9]*) fail "pod $NEW_POD does not resume from a checkpoint (grpo.dev/resume-from='$RESUME_FROM')" ;;
esac
# The deleted trainer may checkpoint once more on SIGTERM, so the resume point is that checkpoint or later.
[ "$RESUME_STEP" -ge "$CKPT_STEP" ] || fail "resumed from step $RESUME_STEP, before the checkpoint of step $CKPT_STEP"
past_resume() { running && [ "$(field .status.progress.step)" -gt "$RESUME_STEP" ] 2>/dev/null; }
wait_until "training past step $RESUME_STEP after the restart" past_resume
echo "training continued: step $(field .status.progress.step) of $(field .status.progress.totalSteps)"

say "6/7 the trainer's Prometheus metrics (rank 0, port 9090, through the API server)"
if [ "${SMOKE_SKIP_METRICS:-0}" = "1" ]; then
  echo "skipped (SMOKE_SKIP_METRICS=1)"
else
  METRICS="$(kubectl get --raw "/api/v1/namespaces/$NS/pods/$NEW_POD:9090/proxy/metrics" 2>&1)" ||
    fail "could not read $NEW_POD's /metrics through the API server: $METRICS (set SMOKE_SKIP_METRICS=1 without pods/proxy rights)"
  for name in grpo_step grpo_reward_mean grpo_last_checkpoint_step grpo_rollouts_total; do
    echo "$METRICS" | grep -E "^$name[ {]" || fail "the trainer's /metrics has no $name"
  done
fi

say "7/7 wait for Succeeded"
finished() { [ "$(field .status.phase)" = "Succeeded" ]; }
wait_until "phase Succeeded" finished
"${K[@]}" get grpojob "$JOB" -o wide
STEPS="$(field .spec.grpo.steps)"
[ "$(field .status.progress.step)" = "$STEPS" ] || fail "status.progress.step is $(field .status.progress.step), not $STEPS"
[ "$(field .status.checkpoint.lastStep)" = "$STEPS" ] || fail "the last checkpoint is of step $(field .status.checkpoint.lastStep), not $STEPS"
[ -n "$(field .status.rewards.mean)" ] || fail "status.rewards.mean is empty"
echo "rewards:    $(field .status.rewards)"
echo "checkpoint: $(field .status.checkpoint)"
echo "restarts:   $(field .status.restarts) (trainer attempts: $(field .status.trainerAttempt))"
echo "events:"
"${K[@]}" get events --field-selector "involvedObject.kind=GRPOJob,involvedObject.name=$JOB" \
  -o custom-columns=REASON:.reason,MESSAGE:.message --sort-by=.lastTimestamp 2>/dev/null | tail -n 12 || true
echo
echo "smoke: PASSED (generation, weight sync, metric service, checkpoint, restart and resume, status$([ "${SMOKE_SKIP_METRICS:-0}" = "1" ] || echo ', metrics'))"
