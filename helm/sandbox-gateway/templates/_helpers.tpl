{{/* vim: set filetype=mustache: */}}

{{- define "sandbox-gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name, at most 63 chars (DNS label). Suffixed objects (-control,
-redis) trim further where they add characters.
*/}}
{{- define "sandbox-gateway.fullname" -}}
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

{{/* A suffixed object name that stays a DNS label: (fullname trimmed) + "-" + suffix. */}}
{{- define "sandbox-gateway.suffixed" -}}
{{- $root := index . 0 }}
{{- $suffix := index . 1 }}
{{- $max := sub 62 (len $suffix) | int }}
{{- printf "%s-%s" (include "sandbox-gateway.fullname" $root | trunc $max | trimSuffix "-") $suffix }}
{{- end }}

{{- define "sandbox-gateway.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object of the release (component added per object). */}}
{{- define "sandbox-gateway.commonLabels" -}}
helm.sh/chart: {{ include "sandbox-gateway.chart" . }}
app.kubernetes.io/name: {{ include "sandbox-gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sandbox-gateway
{{- end }}

{{/* Labels of the gateway's own objects. */}}
{{- define "sandbox-gateway.labels" -}}
{{ include "sandbox-gateway.commonLabels" . }}
app.kubernetes.io/component: gateway
{{- end }}

{{/* Selector labels of the gateway pods (immutable once installed). */}}
{{- define "sandbox-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sandbox-gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end }}

{{- define "sandbox-gateway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sandbox-gateway.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sandbox-gateway.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/*
The policy document as rendered into the ConfigMap: .Values.policy, or the built-in
policy above when it is empty. A kubernetes pool without
kubernetes.namespace is placed in the release namespace, so the file and the RBAC agree.
*/}}
{{- define "sandbox-gateway.defaultPolicy" -}}
pools:
  small:
    provider: kubernetes
    max_sandboxes: 100
    idle_timeout: 10m
    provisioning_timeout: 60s
    kubernetes: {mode: claim, warm_pool: small, port: 8888}
  shared:
    provider: kubernetes
    max_sandboxes: 50
    idle_timeout: 30m
    provisioning_timeout: 2m
    kubernetes: {mode: claim, warm_pool: standard, port: 8888}
routing:
  per_session_orgs: []
  prefix_pools: {ses: small, default: shared}
{{- end }}

{{- define "sandbox-gateway.policy" -}}
{{- $policy := deepCopy (.Values.policy | default (include "sandbox-gateway.defaultPolicy" . | fromYaml)) }}
{{- range $name, $pool := $policy.pools }}
{{- if eq (toString ($pool.provider | default "local")) "kubernetes" }}
{{- $k8s := $pool.kubernetes | default dict }}
{{- if not $k8s.namespace }}
{{- $_ := set $k8s "namespace" $.Release.Namespace }}
{{- end }}
{{- $_ := set $pool "kubernetes" $k8s }}
{{- end }}
{{- end }}
{{- toYaml $policy }}
{{- end }}

{{/* Namespaces of the kubernetes pools, as a JSON list (sorted, unique). */}}
{{- define "sandbox-gateway.poolNamespaces" -}}
{{- $policy := include "sandbox-gateway.policy" . | fromYaml }}
{{- $namespaces := list }}
{{- range $name, $pool := $policy.pools }}
{{- if eq (toString ($pool.provider | default "local")) "kubernetes" }}
{{- $namespaces = append $namespaces $pool.kubernetes.namespace }}
{{- end }}
{{- end }}
{{- $namespaces | uniq | sortAlpha | toJson }}
{{- end }}

{{/* The sandbox ports of the kubernetes pools per namespace, as JSON {namespace: [ports]} (egress). */}}
{{- define "sandbox-gateway.sandboxPorts" -}}
{{- $policy := include "sandbox-gateway.policy" . | fromYaml }}
{{- $ports := dict }}
{{- range $name, $pool := $policy.pools }}
{{- if eq (toString ($pool.provider | default "local")) "kubernetes" }}
{{- $ns := $pool.kubernetes.namespace }}
{{- $_ := set $ports $ns (append (default (list) (get $ports $ns)) (int ($pool.kubernetes.port | default 8888)) | uniq) }}
{{- end }}
{{- end }}
{{- $ports | toJson }}
{{- end }}

{{/* Namespaces that get a Role + RoleBinding: pool namespaces + rbac.extraNamespaces. */}}
{{- define "sandbox-gateway.rbacNamespaces" -}}
{{- $namespaces := include "sandbox-gateway.poolNamespaces" . | fromJsonArray }}
{{- concat $namespaces .Values.rbac.extraNamespaces | uniq | sortAlpha | toJson }}
{{- end }}

{{/*
The pool modes in each Role namespace, as JSON {namespace: [modes]}: a pool's
kubernetes.mode (default sandbox); an rbac.extraNamespaces entry gets both.
*/}}
{{- define "sandbox-gateway.namespaceModes" -}}
{{- $policy := include "sandbox-gateway.policy" . | fromYaml }}
{{- $modes := dict }}
{{- range $name, $pool := $policy.pools }}
{{- if eq (toString ($pool.provider | default "local")) "kubernetes" }}
{{- $ns := $pool.kubernetes.namespace }}
{{- $_ := set $modes $ns (append (default (list) (get $modes $ns)) ($pool.kubernetes.mode | default "sandbox") | uniq | sortAlpha) }}
{{- end }}
{{- end }}
{{- range .Values.rbac.extraNamespaces }}
{{- $_ := set $modes . (list "claim" "sandbox") }}
{{- end }}
{{- $modes | toJson }}
{{- end }}

{{/*
The API calls of the Kubernetes provider for the pool modes of one namespace (the argument:
a list of modes), and nothing more: exactly rbac_rules(modes) in
gateway/providers/kubernetes_api.py (tests/helm/test_rbac.py compares). A claim-only
namespace cannot create or delete Sandboxes (which amounts to creating arbitrary pods).
*/}}
{{- define "sandbox-gateway.providerRules" -}}
{{- if has "sandbox" . }}
- apiGroups: ["agents.x-k8s.io"]
  resources: ["sandboxes"]
  # patch: suspend and resume (spec.operatingMode; spec.replicas at v1alpha1), the claimed Sandbox included
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
{{- else }}
- apiGroups: ["agents.x-k8s.io"]
  resources: ["sandboxes"]
  # a claim's Sandbox: suspended and resumed (patch), watched until ready again (list, watch)
  verbs: ["list", "watch", "patch"]
{{- end }}
{{- if has "claim" . }}
- apiGroups: ["extensions.agents.x-k8s.io"]
  resources: ["sandboxclaims"]
  verbs: ["get", "list", "watch", "create", "delete"]
{{- end }}
{{- end }}

{{/*
The API calls of the router headers' Sandbox lookup (SandboxLocator) in each routerCompat
namespace, and nothing more: exactly LOCATOR_RBAC_RULES in gateway/compat_locator.py
(tests/helm/test_rbac.py compares).
*/}}
{{- define "sandbox-gateway.locatorRules" -}}
- apiGroups: ["agents.x-k8s.io"]
  resources: ["sandboxes"]
  verbs: ["get"]
{{- end }}

{{/* The router-compat Role/RoleBinding name: distinct from the pool Role's, so a namespace can hold both. */}}
{{- define "sandbox-gateway.routerCompatName" -}}
{{- include "sandbox-gateway.suffixed" (list . "router-compat") }}
{{- end }}

{{/* True (non-empty) when more than one gateway pod can run at once. */}}
{{- define "sandbox-gateway.multiPod" -}}
{{- if .Values.autoscaling.enabled }}
{{- if gt (int .Values.autoscaling.maxReplicas) 1 }}true{{ end }}
{{- else if gt (int .Values.replicaCount) 1 }}true
{{- end }}
{{- end }}

{{/* True (non-empty) when more than one gateway process can run at once (pods or workers). */}}
{{- define "sandbox-gateway.multiProcess" -}}
{{- if or (include "sandbox-gateway.multiPod" .) (gt (int (.Values.config.workers | default 1)) 1) }}true{{ end }}
{{- end }}

{{/* config.drain_timeout, or the gateway's default (20 s) when unset. 0 is a valid value. */}}
{{- define "sandbox-gateway.drainTimeout" -}}
{{- if kindIs "invalid" .Values.config.drain_timeout }}20{{ else }}{{ .Values.config.drain_timeout }}{{ end }}
{{- end }}

{{/*
The Redis URL source: "secret", "url", "embedded" or "" (memory store). An external Redis
(existingSecret or url) wins over redis.embedded.enabled, which is on by default.
*/}}
{{- define "sandbox-gateway.redisMode" -}}
{{- if .Values.redis.existingSecret.name }}secret
{{- else if .Values.redis.url }}url
{{- else if .Values.redis.embedded.enabled }}embedded
{{- end }}
{{- end }}

{{- define "sandbox-gateway.policyConfigMapName" -}}
{{- include "sandbox-gateway.suffixed" (list . "policy") }}
{{- end }}

{{- define "sandbox-gateway.redisSecretName" -}}
{{- include "sandbox-gateway.suffixed" (list . "redis-url") }}
{{- end }}

{{- define "sandbox-gateway.redisName" -}}
{{- include "sandbox-gateway.suffixed" (list . "redis") }}
{{- end }}

{{/* Where the gateway reads its key file (the keys Secret is mounted as this directory). */}}
{{- define "sandbox-gateway.authKeysDir" -}}
/etc/sandbox-gateway/auth
{{- end }}

{{/* Where the gRPC TLS Secret (grpc.tls.secretName) is mounted. */}}
{{- define "sandbox-gateway.grpcTlsDir" -}}
/etc/sandbox-gateway/grpc-tls
{{- end }}

{{/*
Where the key file comes from: "secret" (auth.keysSecret, managed by you), "inline"
(auth.keys, rendered into the chart's Secret) or "generated" (neither: a random HS256 key
in the chart's Secret, kept across upgrades and uninstalls).
*/}}
{{- define "sandbox-gateway.authKeysSource" -}}
{{- if .Values.auth.keysSecret }}secret
{{- else if .Values.auth.keys }}inline
{{- else }}generated
{{- end }}
{{- end }}

{{/* The Secret mounted at authKeysDir: auth.keysSecret, or the chart's <fullname>-auth. */}}
{{- define "sandbox-gateway.authSecretName" -}}
{{- if .Values.auth.keysSecret }}{{ .Values.auth.keysSecret }}
{{- else }}{{ include "sandbox-gateway.suffixed" (list . "auth") }}
{{- end }}
{{- end }}

{{/* Marks a chart-generated keys Secret; only such a Secret is reused by the lookup below. */}}
{{- define "sandbox-gateway.generatedKeysAnnotation" -}}
sandbox-gateway/generated-keys
{{- end }}

{{/*
keys.yaml of the chart's own Secret (sources "inline" and "generated"). A generated key is
taken from the live Secret when there is one (lookup: helm install/upgrade; empty under
helm template), else made with randAlphaNum. The result is memoised for the render, so the
Secret and the pod's checksum/auth-keys annotation see the same random key.
*/}}
{{- define "sandbox-gateway.authKeysYaml" -}}
{{- if not (hasKey .Values.auth "__keysYaml") }}
{{- $yaml := "" }}
{{- if .Values.auth.keys }}
{{- $yaml = printf "# Rendered by the sandbox-gateway chart from auth.keys.\n%s\n" (toYaml (dict "keys" .Values.auth.keys)) }}
{{- else }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "sandbox-gateway.authSecretName" .) }}
{{- if $existing }}
{{- $annotations := $existing.metadata.annotations | default dict }}
{{- $data := $existing.data | default dict }}
{{- if and (index $annotations (include "sandbox-gateway.generatedKeysAnnotation" .)) (index $data "keys.yaml") }}
{{- $yaml = index $data "keys.yaml" | b64dec }}
{{- end }}
{{- end }}
{{- if not $yaml }}
{{- $yaml = printf "# Generated by the sandbox-gateway chart (no auth.keysSecret or auth.keys given).\nkeys:\n  - kid: generated-1\n    alg: HS256\n    secret: %s\n" (randAlphaNum 64 | quote) }}
{{- end }}
{{- end }}
{{- $_ := set .Values.auth "__keysYaml" $yaml }}
{{- end }}
{{- index .Values.auth "__keysYaml" }}
{{- end }}

{{/* A settings value as an env var string: whole numbers without exponent or ".0". */}}
{{- define "sandbox-gateway.envValue" -}}
{{- if and (kindIs "float64" .) (eq . (floor .)) }}{{ int64 . | toString | quote }}
{{- else }}{{ toString . | quote }}
{{- end }}
{{- end }}

{{/* Refuse values that would deploy something broken; every message says how to fix it. */}}
{{- define "sandbox-gateway.validate" -}}
{{- if and .Values.redis.url .Values.redis.existingSecret.name }}
{{- fail "redis: set only one of redis.url and redis.existingSecret.name" }}
{{- end }}
{{- if and (include "sandbox-gateway.multiProcess" .) (not (include "sandbox-gateway.redisMode" .)) }}
{{- fail "redis: more than one gateway replica or worker needs a shared session store; set redis.url, redis.existingSecret.name or redis.embedded.enabled (or replicaCount: 1, config.workers: 1 and autoscaling.enabled: false)" }}
{{- end }}
{{- range $name, $pool := (include "sandbox-gateway.policy" . | fromYaml).pools }}
{{- if and (eq (toString ($pool.provider | default "local")) "local") (include "sandbox-gateway.multiPod" $) }}
{{- fail (printf "policy.pools.%s: provider 'local' runs sandboxes inside one gateway pod, so other replicas cannot reach them; use provider kubernetes or static, or run a single replica (replicaCount: 1, autoscaling.enabled: false)" $name) }}
{{- end }}
{{- end }}
{{- $drain := include "sandbox-gateway.drainTimeout" . | float64 }}
{{- $needed := addf $drain (float64 .Values.preStopSleepSeconds) }}
{{- if le (float64 .Values.terminationGracePeriodSeconds) $needed }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must be greater than preStopSleepSeconds (%v) + config.drain_timeout (%v), or the kubelet kills the gateway mid-drain" .Values.terminationGracePeriodSeconds .Values.preStopSleepSeconds $drain) }}
{{- end }}
{{- if and .Values.auth.keysSecret .Values.auth.keys }}
{{- fail "auth: set only one of auth.keysSecret (an existing Secret with keys.yaml; for production) and auth.keys (inline keys; for trying out)" }}
{{- end }}
{{- $kids := list }}
{{- range .Values.auth.keys }}
{{- if has .kid $kids }}
{{- fail (printf "auth.keys: kid %q appears more than once; every key needs its own kid" .kid) }}
{{- end }}
{{- $kids = append $kids .kid }}
{{- end }}
{{- if and .Values.autoscaling.enabled (lt (int .Values.autoscaling.maxReplicas) (int .Values.autoscaling.minReplicas)) }}
{{- fail "autoscaling.maxReplicas must be >= autoscaling.minReplicas" }}
{{- end }}
{{- end }}
