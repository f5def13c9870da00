#!/usr/bin/env bash
# Builds the local control-plane binaries from Go modules through the module proxy and caches them
# outside the repository, keyed by version:
#   $GRPO_TESTBINS/k8s-$K8S_VERSION/{kube-apiserver,kube-controller-manager,kube-scheduler,kubectl}
#   $GRPO_TESTBINS/etcd-$ETCD_VERSION/{etcd,etcdctl}
#   $GRPO_TESTBINS/kwok-$KWOK_VERSION/{kwok,kwokctl}
#   $GRPO_TESTBINS/helm-$HELM_VERSION/helm
#   $GRPO_TESTBINS/kubeconform-$KUBECONFORM_VERSION/kubeconform
#   $GRPO_TESTBINS/kueue-$KUEUE_VERSION/{kueue,crds/,webhook/}   (with the others; alone: `hack/testbins.sh kueue`)
# A component counts as built only when its directory holds a `.ready` file, written last after the
# binaries were moved into place, so an interrupted or failed build is never mistaken for a good one.
# Go's module and build caches survive interruption, so a rerun resumes where the last one stopped.
#
# Usage: hack/testbins.sh [component...]   (default: all)   Prints the cache directory of each.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/versions.env
source "$HERE/versions.env"

export GOWORK=off
export GOFLAGS=-mod=mod
export CGO_ENABLED=0
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
ROOT="${GRPO_TESTBINS:-$HOME/.cache/grpo-testbins}"
mkdir -p "$ROOT"

log() { printf '[testbins %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# Runs a long command while printing a heartbeat, so a newcomer on a cold machine sees it is alive.
with_heartbeat() {
  local what="$1"; shift
  local start=$SECONDS
  ( while sleep 30; do log "still ${what} ($((SECONDS - start))s so far)"; done ) &
  local hb=$!
  local rc=0
  "$@" || rc=$?
  kill "$hb" 2>/dev/null; wait "$hb" 2>/dev/null || true
  if [ "$rc" -ne 0 ]; then
    log "FAILED: ${what} (exit $rc after $((SECONDS - start))s)"
    return "$rc"
  fi
  log "done: ${what} in $((SECONDS - start))s"
}

timed() {  # records wall time and peak RSS of a build step into $OUT_TMP/build-stats.txt
  local label="$1"; shift
  if [ -x /usr/bin/time ]; then
    /usr/bin/time -f "${label}: wall=%es peak_rss=%MKB" -a -o "$OUT_TMP/build-stats.txt" "$@"
  else
    "$@"
  fi
}

begin() {  # begin <component-dir>; sets OUT (final) and OUT_TMP (staging); returns 1 if already ready
  OUT="$ROOT/$1"
  if [ -f "$OUT/.ready" ]; then echo "$OUT"; return 1; fi
  rm -rf "$OUT" "$OUT.partial"
  OUT_TMP="$OUT.partial"
  mkdir -p "$OUT_TMP"
  WORK="$(mktemp -d)"
  log "building $1 into $OUT"
  return 0
}

finish() {
  date -u +%FT%TZ > "$OUT_TMP/.ready"
  mv "$OUT_TMP" "$OUT"
  rm -rf "$WORK"
  echo "$OUT"
}

build_k8s() {
  begin "k8s-$K8S_VERSION" || return 0
  cd "$WORK"
  go mod init local.invalid/k8s-testbins >/dev/null 2>&1
  local kmod minor staging gd ld pkgs
  kmod="$(with_heartbeat "downloading k8s.io/kubernetes@$K8S_VERSION" \
          go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  staging="v0.${K8S_VERSION#v1.}"
  # One replace per staging module, read from the exact go.mod so the list never goes stale.
  for m in $(sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/src/.*#\1#p' "$kmod"); do
    go mod edit "-replace=${m}=${m}@${staging}"
  done
  gd="$(sed -n 's/^godebug default=\(go[0-9.]*\).*/\1/p' "$kmod")"
  [ -n "$gd" ] && go mod edit "-godebug=default=${gd}"
  pkgs="k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl"
  # shellcheck disable=SC2046
  with_heartbeat "resolving the k8s.io/kubernetes module graph (module downloads)" \
    go get -tool $(for p in $pkgs; do printf '%s@%s ' "$p" "$K8S_VERSION"; done)
  # Same version symbols upstream stamps (hack/lib/version.sh) so /version and kubectl are truthful.
  ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X ${p}.gitVersion=${K8S_VERSION} -X ${p}.gitMajor=1 -X ${p}.gitMinor=${minor}"
    ld+=" -X ${p}.gitTreeState=clean -X ${p}.gitCommit=0000000000000000000000000000000000000000"
    ld+=" -X ${p}.buildDate=1970-01-01T00:00:00Z"
  done
  local note=" (the first compiles most of the shared packages: ~7 min on 2 cores)"
  for p in $pkgs; do
    # shellcheck disable=SC2086
    with_heartbeat "compiling ${p##*/} $K8S_VERSION$note" \
      timed "${p##*/}" go build -trimpath -tags selinux,notest -ldflags "$ld" -o "$OUT_TMP/" "$p"
    note=""
  done
  "$OUT_TMP/kube-apiserver" --version >&2
  finish
}

build_etcd() {
  begin "etcd-$ETCD_VERSION" || return 0
  cd "$WORK"
  go mod init local.invalid/etcd-testbins >/dev/null 2>&1
  # Only the server: etcdctl is not needed (the API server is the only client) and some etcdctl
  # versions are not served by the proxy.
  with_heartbeat "resolving etcd $ETCD_VERSION modules" \
    go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  with_heartbeat "compiling etcd $ETCD_VERSION" \
    timed etcd go build -trimpath -ldflags "-s -w" -o "$OUT_TMP/etcd" go.etcd.io/etcd/server/v3
  "$OUT_TMP/etcd" --version >&2
  finish
}

build_kwok() {
  begin "kwok-$KWOK_VERSION" || return 0
  export GOBIN="$OUT_TMP"
  with_heartbeat "compiling kwok and kwokctl $KWOK_VERSION" \
    timed kwok go install -trimpath -ldflags "-s -w" \
      "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwokctl@$KWOK_VERSION"
  # kwok's default Stage manifests ship in its module; keep a copy beside the binaries.
  local dir
  dir="$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  cp -r "$dir/kustomize/stage" "$OUT_TMP/stage"
  chmod -R u+w "$OUT_TMP/stage"
  "$OUT_TMP/kwokctl" --version >&2
  finish
}

build_helm() {
  begin "helm-$HELM_VERSION" || return 0
  export GOBIN="$OUT_TMP"
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  # Without these ldflags Helm 3 reports itself as a bare minor and assumes Kubernetes v1.20 offline.
  local ld="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  ld+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor"
  ld+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor"
  with_heartbeat "compiling helm $HELM_VERSION" \
    timed helm go install -trimpath -ldflags "$ld" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  "$OUT_TMP/helm" version --short >&2
  finish
}

build_kubeconform() {
  begin "kubeconform-$KUBECONFORM_VERSION" || return 0
  export GOBIN="$OUT_TMP"
  with_heartbeat "compiling kubeconform $KUBECONFORM_VERSION" \
    timed kubeconform go install -trimpath -ldflags "-s -w" \
      "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"
  finish
}

build_kueue() {
  begin "kueue-$KUEUE_VERSION" || return 0
  cd "$WORK"
  go mod init local.invalid/kueue-testbins >/dev/null 2>&1
  with_heartbeat "resolving kueue $KUEUE_VERSION modules" \
    go get -tool "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
  local dir main
  dir="$(go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
  main="$dir/cmd/kueue/main.go"
  # cmd/kueue is one file, package main, importing only Kueue's public packages; it is built from a copy
  # in this throwaway module with one line changed (the module itself is untouched): with
  # internalCertManagement off, the manager reads its metrics-server certificate from the fixed
  # in-container path /etc/kueue/metrics/certs, which a process outside a container cannot use without
  # root, so $KUEUE_METRICS_CERT_DIR may name another directory. Fails loudly if the line changes.
  grep -q 'metricsCertPath := "/etc/kueue/metrics/certs"' "$main" || {
    log "cmd/kueue/main.go of $KUEUE_VERSION no longer has the metrics cert path line; update build_kueue"
    return 1
  }
  sed 's#metricsCertPath := "/etc/kueue/metrics/certs"#metricsCertPath := "/etc/kueue/metrics/certs"; if d := os.Getenv("KUEUE_METRICS_CERT_DIR"); d != "" { metricsCertPath = d }#' \
    "$main" > "$WORK/main.go"
  with_heartbeat "compiling the kueue controller manager $KUEUE_VERSION (~10 min cold on 2 cores)" \
    timed kueue go build -trimpath \
      -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
      -o "$OUT_TMP/kueue" .
  # Kueue's CRDs and webhook configurations ship in its module source; keep copies beside the binary
  # so the cluster script installs exactly the schema this manager was built against.
  mkdir -p "$OUT_TMP/crds" "$OUT_TMP/webhook"
  cp "$dir"/config/components/crd/bases/*.yaml "$dir/config/components/crd/kustomization.yaml" "$OUT_TMP/crds/"
  cp "$dir/config/components/webhook/manifests.yaml" "$OUT_TMP/webhook/"
  chmod -R u+w "$OUT_TMP/crds" "$OUT_TMP/webhook"
  finish
}

components=("$@")
[ ${#components[@]} -eq 0 ] && components=(etcd kwok k8s helm kubeconform kueue)
# Room each build takes when nothing is cached: its binaries plus what it adds to Go's module and build
# caches (measured cold, rounded up; shared packages counted with the first component that compiles them).
declare -A disk_mb=([etcd]=400 [kwok]=1000 [k8s]=4500 [helm]=900 [kubeconform]=100 [kueue]=1800)
declare -A dir_of=([etcd]="etcd-$ETCD_VERSION" [kwok]="kwok-$KWOK_VERSION" [k8s]="k8s-$K8S_VERSION"
  [helm]="helm-$HELM_VERSION" [kubeconform]="kubeconform-$KUBECONFORM_VERSION" [kueue]="kueue-$KUEUE_VERSION")
missing=()
for c in "${components[@]}"; do
  if [ -n "${dir_of[$c]:-}" ] && [ ! -f "$ROOT/${dir_of[$c]}/.ready" ]; then
    missing+=("$ROOT" "${disk_mb[$c]}" "${c}_with_its_Go_caches")
  fi
done
[ ${#missing[@]} -eq 0 ] || bash "$HERE/disk-check.sh" "${missing[@]}"

T0=$SECONDS
for c in "${components[@]}"; do
  case "$c" in
    k8s|etcd|kwok|helm|kubeconform|kueue)
      # Not `( ... ) || ...`: bash ignores `set -e` inside a subshell that is the left side of `||`.
      set +e; ( set -e; "build_$c" ); rc=$?; set -e
      if [ "$rc" -ne 0 ]; then
        log "component '$c' FAILED (exit $rc); its cache stays un-ready ($ROOT/*.partial). Rerun to resume."
        exit 1
      fi ;;
    *) log "unknown component '$c' (expected: k8s etcd kwok helm kubeconform kueue)"; exit 2 ;;
  esac
done
log "all requested components ready in $((SECONDS - T0))s under $ROOT"
