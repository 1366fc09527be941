{{/* Names */}}
{{- define "jms-bridge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "jms-bridge.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "jms-bridge.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels */}}
{{- define "jms-bridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "jms-bridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "jms-bridge.labels" -}}
{{ include "jms-bridge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: bridge
helm.sh/chart: {{ include "jms-bridge.chart" . }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The image reference: registry/repository:tag, or @digest */}}
{{- define "jms-bridge.image" -}}
{{- $repo := .Values.image.repository -}}
{{- if .Values.image.registry -}}
{{- $repo = printf "%s/%s" .Values.image.registry .Values.image.repository -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repo .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag | toString) -}}
{{- end -}}
{{- end -}}

{{- define "jms-bridge.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "jms-bridge.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "jms-bridge.configMapName" -}}
{{- printf "%s-config" (include "jms-bridge.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Credentials: "true" when the upstream URLs come from a Secret (yours or the chart's) */}}
{{- define "jms-bridge.createSecret" -}}
{{- if and (not .Values.auth.existingSecret) (or .Values.auth.username .Values.auth.password) -}}
true
{{- end -}}
{{- end -}}

{{- define "jms-bridge.secretName" -}}
{{- if .Values.auth.existingSecret -}}
{{- .Values.auth.existingSecret -}}
{{- else if include "jms-bridge.createSecret" . -}}
{{- printf "%s-upstream" (include "jms-bridge.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* TLS: "true" while a TLS listener is on; the Secret's mount, where config.yaml points */}}
{{- define "jms-bridge.stompTls" -}}
{{- if and .Values.tls.enabled .Values.tls.stomp -}}
true
{{- end -}}
{{- end -}}

{{- define "jms-bridge.amqpTls" -}}
{{- if and .Values.tls.enabled .Values.tls.amqp -}}
true
{{- end -}}
{{- end -}}

{{- define "jms-bridge.tlsDir" -}}
/etc/jms-bridge-tls
{{- end -}}

{{/* USER:PASS@, percent-encoded as a URL's userinfo ("" without credentials).
urlquery encodes a space as "+" and a "+" as "%2B", so every "+" left is a space. */}}
{{- define "jms-bridge.userinfo" -}}
{{- if or .Values.auth.username .Values.auth.password -}}
{{- printf "%s:%s@" (urlquery .Values.auth.username | replace "+" "%20") (urlquery .Values.auth.password | replace "+" "%20") -}}
{{- end -}}
{{- end -}}

{{/* The upstream URLs; the "secret" ones carry the credentials. */}}
{{- define "jms-bridge.upstreamStomp" -}}
{{- printf "stomp://%s%s:%d" .userinfo .Values.upstream.host (int .Values.upstream.stompPort) -}}
{{- end -}}
{{- define "jms-bridge.upstreamAmqp" -}}
{{- $vhost := urlquery .Values.upstream.amqp.vhost | replace "+" "%20" -}}
{{- printf "amqp://%s%s:%d/%s" .userinfo .Values.upstream.host (int .Values.upstream.amqp.port) $vhost -}}
{{- end -}}
{{- define "jms-bridge.upstreamManagement" -}}
{{- printf "http://%s%s:%d" .userinfo .Values.upstream.host (int .Values.upstream.management.port) -}}
{{- end -}}

{{/* config.yaml: the bridge's own setting names. Everything here must be a setting the bridge
in the image accepts: it rejects a config file with an unknown key. */}}
{{- define "jms-bridge.config" -}}
{{- $b := .Values.bridge -}}
{{- $plain := dict "Values" .Values "userinfo" "" -}}
{{- $c := dict
  "broker" $b.broker
  "upstream-stomp" (include "jms-bridge.upstreamStomp" $plain)
  "stomp-listen" (printf "0.0.0.0:%d" (int .Values.containerPorts.stomp))
  "admin-listen" (printf "0.0.0.0:%d" (int .Values.containerPorts.admin))
  "log-format" $b.logFormat
  "log-level" $b.logLevel
  "staging-engine" $b.stagingEngine
  "staging-prefix" $b.stagingPrefix
  "staging-level-prefetch" (int $b.stagingLevelPrefetch)
  "staging-queue-type" $b.stagingQueueType
  "delay-headers" $b.delayHeaders
  "delivery-time-headers" $b.deliveryTimeHeaders
  "delay-disabled" $b.delayDisabled
-}}
{{- if .Values.upstream.amqp.enabled -}}
{{- $_ := set $c "upstream-amqp" (include "jms-bridge.upstreamAmqp" $plain) -}}
{{- end -}}
{{- if .Values.upstream.management.enabled -}}
{{- $_ := set $c "upstream-management" (include "jms-bridge.upstreamManagement" $plain) -}}
{{- end -}}
{{- with $b.redelivery }}{{ $_ := set $c "redelivery" . }}{{ end -}}
{{- with $b.messageRetry }}{{ $_ := set $c "message-retry" . }}{{ end -}}
{{- with $b.journal }}{{ $_ := set $c "journal" . }}{{ end -}}
{{- with $b.stagedCatalogue }}{{ $_ := set $c "staged-catalogue" . }}{{ end -}}
{{- if .Values.adminToken.existingSecret -}}
{{- $_ := set $c "admin-token-file" "/etc/jms-bridge-admin/token" -}}
{{- end -}}
{{- if $b.amqpListen -}}
{{- $_ := set $c "amqp-listen" (printf "0.0.0.0:%d" (int .Values.containerPorts.amqp)) -}}
{{- end -}}
{{- if .Values.tls.enabled -}}
{{- $dir := include "jms-bridge.tlsDir" . -}}
{{- $_ := set $c "tls-cert" (printf "%s/tls.crt" $dir) -}}
{{- $_ := set $c "tls-key" (printf "%s/tls.key" $dir) -}}
{{- with .Values.tls.clientCaKey }}{{ $_ := set $c "tls-client-ca" (printf "%s/%s" $dir .) }}{{ end -}}
{{- end -}}
{{- if include "jms-bridge.stompTls" . -}}
{{- $_ := set $c "stomp-tls-listen" (printf "0.0.0.0:%d" (int .Values.containerPorts.stompTls)) -}}
{{- end -}}
{{- if include "jms-bridge.amqpTls" . -}}
{{- $_ := set $c "amqp-tls-listen" (printf "0.0.0.0:%d" (int .Values.containerPorts.amqpTls)) -}}
{{- end -}}
{{- $c = mergeOverwrite $c (deepCopy .Values.extraConfig) -}}
{{- toYaml $c -}}
{{- end -}}

{{/* Environment variables of the bridge container: the upstream URLs from the Secret, then extraEnv */}}
{{- define "jms-bridge.env" -}}
{{- $secret := include "jms-bridge.secretName" . -}}
{{- if .Values.auth.existingSecretPasswordKey }}
{{- /* the user and password as the Secret holds them: the bridge puts them into its URLs */}}
{{- if .Values.auth.existingSecretUsernameKey }}
- name: JMS_BRIDGE_BROKER_USER
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ .Values.auth.existingSecretUsernameKey }}
{{- else if .Values.auth.username }}
- name: JMS_BRIDGE_BROKER_USER
  value: {{ .Values.auth.username | quote }}
{{- end }}
- name: JMS_BRIDGE_BROKER_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ .Values.auth.existingSecretPasswordKey }}
{{- else if $secret }}
- name: JMS_BRIDGE_UPSTREAM_STOMP
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ .Values.auth.secretKeys.upstreamStomp }}
{{- if or .Values.auth.existingSecret .Values.upstream.amqp.enabled }}
- name: JMS_BRIDGE_UPSTREAM_AMQP
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ .Values.auth.secretKeys.upstreamAmqp }}
      optional: true
{{- end }}
{{- if or .Values.auth.existingSecret .Values.upstream.management.enabled }}
- name: JMS_BRIDGE_UPSTREAM_MANAGEMENT
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ .Values.auth.secretKeys.upstreamManagement }}
      optional: true
{{- end }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The probes: an HTTP GET on the admin port */}}
{{- define "jms-bridge.probe" -}}
{{- $probe := omit .probe "enabled" -}}
httpGet:
  path: {{ .path }}
  port: admin
{{ toYaml $probe }}
{{- end -}}

{{/* Checks no schema can make: values that contradict each other */}}
{{- define "jms-bridge.validate" -}}
{{- $auth := .Values.auth -}}
{{- if and $auth.existingSecretPasswordKey (not $auth.existingSecret) -}}
{{- fail "auth.existingSecretPasswordKey needs auth.existingSecret: the Secret that holds the password" -}}
{{- end -}}
{{- if and $auth.existingSecretUsernameKey (not $auth.existingSecretPasswordKey) -}}
{{- fail "auth.existingSecretUsernameKey needs auth.existingSecretPasswordKey" -}}
{{- end -}}
{{- if and $auth.username $auth.existingSecretUsernameKey -}}
{{- fail "auth: set one of auth.username and auth.existingSecretUsernameKey, not both" -}}
{{- end -}}
{{- if and $auth.existingSecret (not $auth.existingSecretPasswordKey) (or $auth.username $auth.password) -}}
{{- fail "auth.username with auth.existingSecret needs auth.existingSecretPasswordKey (the Secret's password key); auth.password goes in no Secret of yours" -}}
{{- end -}}
{{- if and (eq .Values.mode "sidecar") .Values.metrics.podMonitor.enabled (not .Values.metrics.podMonitor.selector) -}}
{{- fail "metrics.podMonitor.selector: the labels of the pods the bridge runs in (sidecar mode: the chart does not make them)" -}}
{{- end -}}
{{- if and .Values.persistence.enabled (not (or .Values.bridge.stagedCatalogue .Values.bridge.journal)) -}}
{{- fail (printf "persistence.enabled keeps bridge.stagedCatalogue or bridge.journal: set one under %s" .Values.persistence.mountPath) -}}
{{- end -}}
{{- if and (ne .Values.bridge.broker "rabbitmq") (or .Values.upstream.amqp.enabled .Values.upstream.management.enabled) -}}
{{- fail "upstream.amqp.enabled and upstream.management.enabled are for bridge.broker rabbitmq only" -}}
{{- end -}}
{{- if and .Values.pdb.create (ne (toString .Values.pdb.minAvailable) "") (ne (toString .Values.pdb.maxUnavailable) "") -}}
{{- fail "pdb: set one of pdb.minAvailable and pdb.maxUnavailable, not both" -}}
{{- end -}}
{{- if eq (int .Values.containerPorts.stomp) (int .Values.containerPorts.admin) -}}
{{- fail "containerPorts.stomp and containerPorts.admin must differ" -}}
{{- end -}}
{{- if .Values.tls.enabled -}}
{{- if not .Values.tls.secretName -}}
{{- fail "tls.enabled needs tls.secretName: the name of an existing kubernetes.io/tls Secret with tls.crt and tls.key (cert-manager's Certificate makes one)" -}}
{{- end -}}
{{- if not (or .Values.tls.stomp .Values.tls.amqp) -}}
{{- fail "tls.enabled needs tls.stomp or tls.amqp: a TLS listener to turn on" -}}
{{- end -}}
{{- if and .Values.tls.amqp (ne .Values.bridge.broker "rabbitmq") -}}
{{- fail "tls.amqp (AMQP 0-9-1 over TLS) is for bridge.broker rabbitmq only" -}}
{{- end -}}
{{- end -}}
{{- $ports := dict -}}
{{- $listeners := list (list "stomp" true) (list "admin" true) (list "amqp" (or .Values.service.amqpPortEnabled .Values.bridge.amqpListen)) (list "stompTls" (include "jms-bridge.stompTls" .)) (list "amqpTls" (include "jms-bridge.amqpTls" .)) -}}
{{- range $listeners -}}
{{- $name := index . 0 -}}
{{- if index . 1 -}}
{{- $port := toString (int (index $.Values.containerPorts $name)) -}}
{{- with get $ports $port -}}
{{- fail (printf "containerPorts.%s and containerPorts.%s are both %s: each listener needs a port of its own" . $name $port) -}}
{{- end -}}
{{- $_ := set $ports $port $name -}}
{{- end -}}
{{- end -}}
{{- end -}}


{{/* The workload's kind: a StatefulSet when each pod keeps a volume of its own */}}
{{- define "jms-bridge.workloadKind" -}}
{{- if .Values.persistence.enabled -}}StatefulSet{{- else -}}Deployment{{- end -}}
{{- end -}}

{{/* Labels of a Service that is not the clients': its component in place of "bridge" */}}
{{- define "jms-bridge.componentLabels" -}}
{{- $labels := fromYaml (include "jms-bridge.labels" .root) -}}
{{- $_ := set $labels "app.kubernetes.io/component" .component -}}
{{- toYaml $labels -}}
{{- end -}}
