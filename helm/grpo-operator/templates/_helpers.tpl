{{/*
Names. Every define is prefixed with the chart name: defines are global across subcharts.
*/}}
{{- define "grpo-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "grpo-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "grpo-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "grpo-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "grpo-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false: name the ServiceAccount the operator runs as" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "grpo-operator.metricsServiceName" -}}
{{- printf "%s-metrics" (include "grpo-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels: the Helm-recommended set, plus part-of so every object of the project is found by one selector.
*/}}
{{- define "grpo-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "grpo-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "grpo-operator.labels" -}}
helm.sh/chart: {{ include "grpo-operator.chart" . }}
{{ include "grpo-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: grpo-operator
{{- end }}

{{- define "grpo-operator.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
The namespaces the operator watches, as a list; fails early on an inconsistent watch scope.
*/}}
{{- define "grpo-operator.watchNamespaces" -}}
{{- if .Values.watch.allNamespaces }}
{{- if .Values.watch.namespaces }}
{{- fail "watch.allNamespaces is true and watch.namespaces is set: choose one (set watch.allNamespaces=false to watch only the listed namespaces)" }}
{{- end }}
{{- else if not .Values.watch.namespaces }}
{{- fail "watch.allNamespaces is false but watch.namespaces is empty: list the namespaces to watch, e.g. --set 'watch.namespaces={team-a,team-b}'" }}
{{- end }}
{{- toJson (.Values.watch.namespaces | default list | uniq) }}
{{- end }}

{{/*
Namespaces the PodMonitors select: metrics.podMonitors.namespaces, else the watched namespaces.
Renders a namespaceSelector body.
*/}}
{{- define "grpo-operator.podMonitorNamespaceSelector" -}}
{{- $watched := include "grpo-operator.watchNamespaces" . | fromJsonArray }}
{{- $names := .Values.metrics.podMonitors.namespaces | default $watched }}
{{- if $names }}
matchNames:
{{- range $names }}
  - {{ . | quote }}
{{- end }}
{{- else }}
any: true
{{- end }}
{{- end }}

{{/*
Fails with a clear message when a monitoring object is enabled but its API is not served: Helm would
otherwise send an object the API server rejects, or (with a capabilities gate) silently drop it.
Usage: include "grpo-operator.requireApi" (list . "monitoring.coreos.com/v1/ServiceMonitor" "metrics.serviceMonitor.enabled")
*/}}
{{- define "grpo-operator.requireApi" -}}
{{- $root := index . 0 }}
{{- $api := index . 1 }}
{{- $value := index . 2 }}
{{- if not ($root.Capabilities.APIVersions.Has $api) }}
{{- fail (printf "%s=true needs the %s API, which this cluster does not serve: install the Prometheus Operator's CRDs first (or, with `helm template`, pass --api-versions %s)" $value $api $api) }}
{{- end }}
{{- end }}

{{/*
The username the API server gives the operator's ServiceAccount.
*/}}
{{- define "grpo-operator.operatorUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "grpo-operator.serviceAccountName" .) }}
{{- end }}

{{/*
matchResources of the chart's admission policy bindings: the watched namespaces, or every namespace.
Two releases with disjoint watch.namespaces therefore never judge each other's jobs or pods.
*/}}
{{- define "grpo-operator.admissionScope" -}}
{{- $namespaces := include "grpo-operator.watchNamespaces" . | fromJsonArray }}
{{- if $namespaces }}
matchResources:
  namespaceSelector:
    matchExpressions:
      - key: kubernetes.io/metadata.name
        operator: In
        values:
          {{- range $namespaces }}
          - {{ . | quote }}
          {{- end }}
{{- end }}
{{- end }}

{{/*
Refuses to render when platformPolicy.allowedImagePrefixes leaves out jobDefaults.images: every job that
names no trainer or vLLM image runs them, and would be refused (the operator refuses to start too).
Matched on path boundaries, as reconcile/platform_policy.py image_allowed and the admission policy.
*/}}
{{- define "grpo-operator.checkDefaultImages" -}}
{{- $checks := list (dict "prefixes" .Values.platformPolicy.allowedImagePrefixes "images" .Values.jobDefaults.images "prefixesValue" "platformPolicy.allowedImagePrefixes" "imagesValue" "jobDefaults.images") }}
{{- range $team := .Values.teams }}
{{- $images := merge (deepCopy ($team.images | default dict)) $.Values.jobDefaults.images }}
{{- $prefixesValue := ternary (printf "teams.%s.allowedImagePrefixes" $team.name) "platformPolicy.allowedImagePrefixes" (hasKey $team "allowedImagePrefixes") }}
{{- $checks = append $checks (dict "prefixes" ($team.allowedImagePrefixes | default $.Values.platformPolicy.allowedImagePrefixes) "images" $images "prefixesValue" $prefixesValue "imagesValue" (printf "teams.%s.images" $team.name)) }}
{{- end }}
{{- range $check := $checks }}
{{- $prefixes := $check.prefixes }}
{{- if $prefixes }}
{{- range $role := list "trainer" "generation" }}
{{- $image := index $check.images $role }}
{{- $allowed := false }}
{{- range $prefix := $prefixes }}
{{- if or (hasSuffix "/" $prefix) (hasSuffix ":" $prefix) (hasSuffix "@" $prefix) }}
{{- if hasPrefix $prefix $image }}{{ $allowed = true }}{{ end }}
{{- else if or (eq $image $prefix) (hasPrefix (printf "%s/" $prefix) $image) (hasPrefix (printf "%s:" $prefix) $image) (hasPrefix (printf "%s@" $prefix) $image) }}
{{- $allowed = true }}
{{- end }}
{{- end }}
{{- if not $allowed }}
{{- fail (printf "%s.%s %q is not under %s %v, so every job that leaves spec.%s.image unset would be refused: set %s.%s to your registry's copy of it, or add its registry to %s" $check.imagesValue $role $image $check.prefixesValue $prefixes $role $check.imagesValue $role $check.prefixesValue) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Refuses to render budgets in money without prices: nothing could count them (the operator refuses to start
with them too, which would leave it crash-looping after the install).
*/}}
{{- define "grpo-operator.checkBudgets" -}}
{{- if not .Values.pricing.currency }}
{{- range $namespace, $budget := .Values.budgets.namespaces }}
{{- if or $budget.maxAmount (and $budget.default $budget.default.amount) }}
{{- fail (printf "budgets.namespaces.%s limits an amount, but pricing.currency is empty, so nothing could count it: set pricing (currency and gpuHour prices), or limit GPU-hours only (maxGpuHours, default.gpuHours)" $namespace) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
