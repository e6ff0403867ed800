{{/* Names and labels. */}}

{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sluice.fullname" -}}
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

{{- define "sluice.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sluice.labels" -}}
helm.sh/chart: {{ include "sluice.chart" . }}
{{ include "sluice.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sluice.configMapName" -}}
{{- printf "%s-config" (include "sluice.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sluice.image" -}}
{{- printf "%s:%s" .Values.sluice.image.repository (default .Chart.AppVersion .Values.sluice.image.tag) }}
{{- end }}

{{/* "host:port", with an IPv6 host in brackets. */}}
{{- define "sluice.bind" -}}
{{- $host := index . 0 }}
{{- if contains ":" $host }}
{{- printf "[%s]:%d" $host (int (index . 1)) }}
{{- else }}
{{- printf "%s:%d" $host (int (index . 1)) }}
{{- end }}
{{- end }}

{{/* Ports sharing the pod's network namespace must all differ. */}}
{{- define "sluice.checkPorts" -}}
{{- $traffic := int .Values.sluice.ports.traffic }}
{{- $admin := int .Values.sluice.ports.admin }}
{{- $app := int .Values.app.port }}
{{- if eq $traffic $admin }}
{{- fail "sluice.ports.traffic and sluice.ports.admin must differ" }}
{{- end }}
{{- if or (eq $app $traffic) (eq $app $admin) }}
{{- fail (printf "app.port (%d) must differ from sluice's ports (traffic %d, admin %d): they share the pod's network namespace" $app $traffic $admin) }}
{{- end }}
{{- end }}

{{/*
The sluice configuration: the user's `sluice.config` plus what only the
chart knows (listen and admin addresses, the application's loopback URL)
and the ${NAME} references of the secrets it passes in.
*/}}
{{- define "sluice.config" -}}
{{- include "sluice.checkPorts" . }}
{{- $cfg := deepCopy (default (dict) .Values.sluice.config) }}
{{- if and (hasKey $cfg "version") (ne (toString (index $cfg "version")) "1") }}
{{- fail "sluice.config.version: only version 1 exists (the chart writes it; leave it out)" }}
{{- end }}
{{- $_ := set $cfg "version" 1 }}

{{- $server := default (dict) (index $cfg "server") }}
{{- if or (hasKey $server "listen") (hasKey $server "admin") }}
{{- fail "sluice.config.server.listen/admin are set by the chart: use sluice.ports and sluice.bindAddress" }}
{{- end }}
{{- $_ := set $server "listen" (include "sluice.bind" (list .Values.sluice.bindAddress .Values.sluice.ports.traffic)) }}
{{- $_ := set $server "admin" (include "sluice.bind" (list .Values.sluice.bindAddress .Values.sluice.ports.admin)) }}
{{- $_ := set $cfg "server" $server }}

{{- $upstream := default (dict) (index $cfg "upstream") }}
{{- if hasKey $upstream "url" }}
{{- fail "sluice.config.upstream.url is set by the chart (http://127.0.0.1:<app.port>): use app.port" }}
{{- end }}
{{- $_ := set $upstream "url" (printf "http://127.0.0.1:%d" (int .Values.app.port)) }}
{{- $_ := set $cfg "upstream" $upstream }}

{{- $secrets := .Values.sluice.secrets }}
{{- if $secrets.pseudonymKey.secretName }}
{{- $identity := default (dict) (index $cfg "identity") }}
{{- if not (hasKey $identity "pseudonym_key") }}
{{- $_ := set $identity "pseudonym_key" "${SLUICE_PSEUDONYM_KEY}" }}
{{- end }}
{{- $_ := set $cfg "identity" $identity }}
{{- end }}

{{- if $secrets.redisUrl.secretName }}
{{- $store := default (dict) (index $cfg "store") }}
{{- if and (eq (toString (index $store "kind")) "redis") (not (hasKey $store "url")) }}
{{- $_ := set $store "url" "${REDIS_URL}" }}
{{- end }}
{{- $_ := set $cfg "store" $store }}
{{- end }}

{{- /*
With `on_failure: local` (on the store or on any policy) each replica
enforces every quota divided by `store.local_share`: the replicas sharing
the store are this Deployment's, so unless the user says otherwise the
share is `replicaCount`. Written only when something uses `local` (sluice
refuses a `local_share` nothing uses).
*/}}
{{- $store := default (dict) (index $cfg "store") }}
{{- $local := eq (toString (index $store "on_failure")) "local" }}
{{- range $name, $policy := (default (dict) (index $cfg "policies")) }}
{{- if and (kindIs "map" $policy) (eq (toString (index $policy "on_failure")) "local") }}
{{- $local = true }}
{{- end }}
{{- end }}
{{- if and $local (not (hasKey $store "local_share")) }}
{{- $_ := set $store "local_share" (max 1 (int .Values.replicaCount)) }}
{{- $_ := set $cfg "store" $store }}
{{- end }}

{{- toYaml $cfg }}
{{- end }}

{{/* The sluice container, as a regular container or a native sidecar. */}}
{{- define "sluice.container" -}}
{{- $s := .Values.sluice -}}
- name: sluice
  image: {{ include "sluice.image" . | quote }}
  imagePullPolicy: {{ $s.image.pullPolicy }}
  {{- if or $s.nativeSidecar (eq $.Values.mode "sidecar-only") }}
  # An init container that keeps running: started before the application,
  # stopped after it.
  restartPolicy: Always
  {{- end }}
  args:
    - run
    - --config
    - /etc/sluice/sluice.yaml
    {{- if eq $s.logFormat "text" }}
    - --log-format
    - text
    {{- end }}
    {{- range $s.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  ports:
    # Names no application uses (`http` is the commonest app port name: a
    # Service or monitor targeting it would reach either container).
    - name: sluice
      containerPort: {{ int $s.ports.traffic }}
      protocol: TCP
    - name: sluice-metrics
      containerPort: {{ int $s.ports.admin }}
      protocol: TCP
  env:
    - name: SLUICE_LOG
      value: {{ $s.logLevel | quote }}
    {{- with $s.secrets.pseudonymKey }}
    {{- if .secretName }}
    - name: SLUICE_PSEUDONYM_KEY
      valueFrom:
        secretKeyRef:
          name: {{ .secretName }}
          key: {{ .key }}
    {{- end }}
    {{- end }}
    {{- with $s.secrets.redisUrl }}
    {{- if .secretName }}
    - name: REDIS_URL
      valueFrom:
        secretKeyRef:
          name: {{ .secretName }}
          key: {{ .key }}
    {{- end }}
    {{- end }}
    {{- range $s.secrets.extra }}
    - name: {{ .name }}
      valueFrom:
        secretKeyRef:
          name: {{ .secretName }}
          key: {{ .key }}
    {{- end }}
    {{- with $s.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  volumeMounts:
    # The whole directory, never a subPath: only a directory mount sees the
    # kubelet's updates, which sluice reloads.
    - name: sluice-config
      mountPath: /etc/sluice
      readOnly: true
    {{- with $s.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  startupProbe:
    httpGet:
      path: /healthz
      port: sluice-metrics
    {{- toYaml $s.startupProbe | nindent 4 }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: sluice-metrics
    {{- toYaml $s.livenessProbe | nindent 4 }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: sluice-metrics
    {{- toYaml $s.readinessProbe | nindent 4 }}
  {{- if gt (int $s.preStopSleepSeconds) 0 }}
  lifecycle:
    preStop:
      sleep:
        seconds: {{ int $s.preStopSleepSeconds }}
  {{- end }}
  {{- with $s.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $s.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/* Labels of the pods sluice runs in: the chart's own, or the team's. */}}
{{- define "sluice.podSelector" -}}
{{- if eq .Values.mode "sidecar-only" }}
{{- if not .Values.sidecarOnly.selector }}
{{- fail "mode sidecar-only needs sidecarOnly.selector: the labels of the existing pods sluice is added to (the Service selects them)" }}
{{- end }}
{{- toYaml .Values.sidecarOnly.selector }}
{{- else }}
{{- include "sluice.selectorLabels" . }}
{{- end }}
{{- end }}

{{/*
Milliseconds in a duration written Go-style: one or more <integer><unit>
with unit ms, s, m or h ("500ms", "5s", "1m30s"). Called with (list KEY
VALUE); anything else fails the render naming KEY.
*/}}
{{- define "sluice.durationMs" -}}
{{- $key := index . 0 }}
{{- $text := toString (index . 1) | trim }}
{{- if not (regexMatch "^([0-9]+ *(ms|s|m|h) *)+$" $text) }}
{{- fail (printf "%s: %q is not a duration the chart can add up; write it as e.g. 500ms, 5s, 1m or 1m30s" $key $text) }}
{{- end }}
{{- $ms := 0 }}
{{- range regexFindAll "[0-9]+ *(ms|s|m|h)" $text -1 }}
{{- $n := regexFind "^[0-9]+" . | atoi }}
{{- $unit := regexFind "(ms|s|m|h)$" . }}
{{- $scale := get (dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000) $unit }}
{{- $ms = add $ms (mul $n $scale) }}
{{- end }}
{{- $ms }}
{{- end }}

{{/*
Shutdown, in milliseconds, as a dict: what the application takes to stop
(app.stopSeconds: its preStop and its drain after SIGTERM), what sluice
takes (its preStop sleep, shutdown_delay, shutdown_grace), and what the pod
needs. The kubelet stops a pod's regular containers together, so with
sluice among them the pod needs the longer of the two; a native sidecar
(an init container with restartPolicy Always, always so in sidecar-only
mode) gets its preStop and SIGTERM only once the application has exited,
so the pod needs the sum.
*/}}
{{- define "sluice.shutdown" -}}
{{- $server := default (dict) (index (default (dict) .Values.sluice.config) "server") }}
{{- $delay := default "5s" (index $server "shutdown_delay") }}
{{- $grace := default "20s" (index $server "shutdown_grace") }}
{{- $preStop := int .Values.sluice.preStopSleepSeconds }}
{{- $app := int (default 0 .Values.app.stopSeconds) }}
{{- $sluice := add (include "sluice.durationMs" (list "sluice.config.server.shutdown_delay" $delay) | atoi) (include "sluice.durationMs" (list "sluice.config.server.shutdown_grace" $grace) | atoi) (mul $preStop 1000) }}
{{- $native := or .Values.sluice.nativeSidecar (eq .Values.mode "sidecar-only") }}
{{- $need := max (mul $app 1000) $sluice }}
{{- if $native }}
{{- $need = add (mul $app 1000) $sluice }}
{{- end }}
{{- toJson (dict "delay" $delay "grace" $grace "preStop" $preStop "app" $app "sluiceMs" $sluice "needMs" $need "native" $native) }}
{{- end }}

{{/* Milliseconds as seconds for a message: "25", "30.5". */}}
{{- define "sluice.seconds" -}}
{{- if mod . 1000 }}
{{- printf "%.3f" (divf . 1000) | trimSuffix "0" | trimSuffix "0" }}
{{- else }}
{{- printf "%d" (div . 1000) }}
{{- end }}
{{- end }}

{{/*
terminationGracePeriodSeconds: the kubelet kills the pod that long after
deletion starts, so everything of sluice.shutdown must fit in it. Unset, it
is computed: the need rounded up, plus 5 s for the processes to exit (30 s
with the defaults). Set, a value not greater than the need fails the
render, naming each term.
*/}}
{{- define "sluice.terminationGracePeriodSeconds" -}}
{{- $s := include "sluice.shutdown" . | fromJson }}
{{- $need := int64 $s.needMs }}
{{- $tgps := .Values.terminationGracePeriodSeconds }}
{{- if kindIs "invalid" $tgps }}
{{- add (div (add $need 999) 1000) 5 }}
{{- else if le (mul (int64 $tgps) 1000) $need }}
{{- $sluiceSum := printf "sluice.preStopSleepSeconds (%d) + sluice.config.server.shutdown_delay (%s) + shutdown_grace (%s)" (int $s.preStop) $s.delay $s.grace }}
{{- if $s.native }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be greater than app.stopSeconds (%d) + %s = %ss: as a native sidecar sluice gets SIGTERM only after the application has exited, and the kubelet would kill it while requests still drain (leave terminationGracePeriodSeconds unset to have it computed)" (int64 $tgps) (int $s.app) $sluiceSum (include "sluice.seconds" $need)) }}
{{- else }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be greater than app.stopSeconds (%d) and than %s = %ss, or the kubelet kills sluice while requests still drain (leave terminationGracePeriodSeconds unset to have it computed)" (int64 $tgps) (int $s.app) $sluiceSum (include "sluice.seconds" (int64 $s.sluiceMs))) }}
{{- end }}
{{- else }}
{{- int64 $tgps }}
{{- end }}
{{- end }}

{{/*
sha256 of what sluice reads only at start: the restart-only keys of the
rendered configuration (the product documentation's "Hot reload" list),
the Secret references and secretsChecksum (a reload does not re-read
environment variables), and the image. Hot-reloadable keys (policies,
routes, default, identity, responses, server.paths, ...) are left out, so
changing them does not roll the pods: sluice reloads the mounted file.
*/}}
{{- define "sluice.restartChecksum" -}}
{{- $cfg := include "sluice.config" . | fromYaml }}
{{- $server := default (dict) (index $cfg "server") }}
{{- $upstream := default (dict) (index $cfg "upstream") }}
{{- $store := default (dict) (index $cfg "store") }}
{{- $restart := dict
  "server" (pick $server "listen" "admin" "tls" "shutdown_delay" "shutdown_grace" "header_read_timeout" "max_header_bytes" "workers" "idle_timeout" "send_timeout" "max_connections" "max_connections_per_ip" "http2" "request_heads" "proxy_protocol")
  "upstream" (pick $upstream "connect_timeout")
  "store" (omit $store "budget" "on_failure" "local_share" "failure_retry_after")
}}
{{- $inputs := dict
  "config" $restart
  "secrets" .Values.sluice.secrets
  "secretsChecksum" (toString .Values.sluice.secretsChecksum)
  "image" (include "sluice.image" .)
}}
{{- toJson $inputs | sha256sum }}
{{- end }}

{{/*
Annotations of every pod sluice runs in, whichever mode. The Prometheus
ones only on the chart's own pod (app mode), and only when podAnnotations
has none of its own: a pod has one prometheus.io/port, and the
application's stays the application's. sluice is scraped through its port
named sluice-metrics otherwise (metrics.podMonitor, metrics.serviceMonitor,
or a scrape job keeping that port name).
*/}}
{{- define "sluice.podAnnotations" -}}
checksum/sluice-restart: {{ include "sluice.restartChecksum" . }}
{{- $own := false }}
{{- range $key, $_ := .Values.podAnnotations }}
{{- if hasPrefix "prometheus.io/" $key }}
{{- $own = true }}
{{- end }}
{{- end }}
{{- if and .Values.metrics.podAnnotations (eq .Values.mode "app") (not $own) }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.sluice.ports.admin | int | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end }}

{{/*
sidecar-only mode: a strategic-merge patch of an existing Deployment that
adds sluice as a native sidecar (merged by name into initContainers, so the
application's own init containers and containers stay as they are), the
config volume, the pod annotations and the grace period sluice needs.
*/}}
{{- define "sluice.podPatch" -}}
spec:
  template:
    metadata:
      annotations:
        {{- include "sluice.podAnnotations" . | nindent 8 }}
    spec:
      terminationGracePeriodSeconds: {{ include "sluice.terminationGracePeriodSeconds" . }}
      initContainers:
        {{- include "sluice.container" . | nindent 8 }}
      volumes:
        - name: sluice-config
          configMap:
            name: {{ include "sluice.configMapName" . }}
        {{- with .Values.extraVolumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
{{- end }}

{{/* The ports networkPolicy.extraIngress admits, comma separated. */}}
{{- define "sluice.extraIngressPorts" -}}
{{- $ports := list }}
{{- range .Values.networkPolicy.extraIngress }}
{{- range (default (list) .ports) }}
{{- if hasKey . "port" }}
{{- $ports = append $ports (toString .port) }}
{{- end }}
{{- end }}
{{- end }}
{{- join "," (uniq $ports) }}
{{- end }}
