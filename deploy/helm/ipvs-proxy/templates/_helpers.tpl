{{/* The DaemonSet's selector: immutable, so the name alone, as in chart
0.2.0 and deploy/ (one ipvs-proxy per node: a second release would fight
over the node). */}}
{{- define "ipvs-proxy.selectorLabels" -}}
app.kubernetes.io/name: ipvs-proxy
{{- end }}

{{/* The version the labels give: the image's tag, else the chart's
appVersion (a label value: at most 63 characters, no "+"). */}}
{{- define "ipvs-proxy.version" -}}
{{- .Values.image.tag | default .Chart.AppVersion | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/* The labels of the pods: Kubernetes' recommended ones and k8s-app (the
label kube-system's add-ons carry), without helm.sh/chart, so that a new
chart of the same image restarts no agent; and values' podLabels (which
cannot replace those). */}}
{{- define "ipvs-proxy.podLabels" -}}
{{- $labels := dict
  "app.kubernetes.io/name" "ipvs-proxy"
  "app.kubernetes.io/instance" .Release.Name
  "app.kubernetes.io/version" (include "ipvs-proxy.version" .)
  "app.kubernetes.io/managed-by" .Release.Service
  "k8s-app" "ipvs-proxy" -}}
{{- toYaml (merge $labels (.Values.podLabels | default dict)) }}
{{- end }}

{{/* The labels of every object. */}}
{{- define "ipvs-proxy.labels" -}}
app.kubernetes.io/name: ipvs-proxy
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ include "ipvs-proxy.version" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
k8s-app: ipvs-proxy
{{- end }}

{{/* The service account's name. */}}
{{- define "ipvs-proxy.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default "ipvs-proxy" -}}
{{- end }}

{{/* Whether a ServiceMonitor or a PodMonitor scrapes the agents (and so
the metrics address is opened to the pod network). */}}
{{- define "ipvs-proxy.scraped" -}}
{{- if and .Values.serviceMonitor.enabled .Values.podMonitor.enabled -}}
{{- fail "serviceMonitor.enabled and podMonitor.enabled: enable one (both scrape every agent, twice)" -}}
{{- end -}}
{{- if or .Values.serviceMonitor.enabled .Values.podMonitor.enabled -}}true{{- end -}}
{{- end }}

{{/* config.metricsBindAddress as the agent gets it: a loopback address is
opened to the pod network (0.0.0.0, same port) when a monitor scrapes. */}}
{{- define "ipvs-proxy.metricsBindAddress" -}}
{{- $addr := .Values.config.metricsBindAddress | default "" -}}
{{- if include "ipvs-proxy.scraped" . -}}
{{- if not $addr -}}
{{- fail "serviceMonitor/podMonitor enabled but config.metricsBindAddress is empty: nothing to scrape" -}}
{{- end -}}
{{- if or (hasPrefix "127." $addr) (hasPrefix "[::1]" $addr) (hasPrefix "localhost" $addr) -}}
{{- $addr = printf "0.0.0.0:%s" (include "ipvs-proxy.port" $addr) -}}
{{- end -}}
{{- end -}}
{{ $addr }}
{{- end }}

{{/* The image of both containers: repository:tag (the chart's appVersion
when the tag is empty), or repository@digest. */}}
{{- define "ipvs-proxy.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
{{- end }}

{{/* The port of a bind address (host:port, [v6]:port). */}}
{{- define "ipvs-proxy.port" -}}
{{- $port := . | splitList ":" | last -}}
{{- if not (regexMatch "^[0-9]+$" $port) -}}
{{- fail (printf "bind address %q has no port (want host:port)" .) -}}
{{- end -}}
{{ $port }}
{{- end }}

{{/* The host kubelet's probes ask, from config.healthzBindAddress: its
address, or 127.0.0.1 when it binds every address (0.0.0.0, ::, none). */}}
{{- define "ipvs-proxy.probeHost" -}}
{{- $host := . | splitList ":" | initial | join ":" | trimPrefix "[" | trimSuffix "]" -}}
{{- if has $host (list "" "0.0.0.0" "::") -}}
127.0.0.1
{{- else -}}
{{ $host }}
{{- end -}}
{{- end }}

{{/* The options of both containers' commands after the subcommand. */}}
{{- define "ipvs-proxy.args" -}}
- --config=/etc/ipvs-proxy/config.yaml
- --hostname-override=$(NODE_NAME)
{{- end }}

{{/* The relabelings of both monitors: the job monitoring.job, and the
node's name as `node`. */}}
{{- define "ipvs-proxy.relabelings" -}}
- targetLabel: job
  replacement: {{ .Values.monitoring.job | quote }}
- sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: node
{{- end }}

{{/* A monitor's endpoint: (dict "top" $ "monitor" .Values.xMonitor). */}}
{{- define "ipvs-proxy.endpoint" -}}
port: metrics
path: /metrics
{{- with .monitor.interval }}
interval: {{ . }}
{{- end }}
{{- with .monitor.scrapeTimeout }}
scrapeTimeout: {{ . }}
{{- end }}
relabelings:
  {{- include "ipvs-proxy.relabelings" .top | nindent 2 }}
  {{- with .monitor.relabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .monitor.metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The seconds of a Go duration (1m30s: 90; 500ms: 0.5), as the schema's
duration pattern allows them. */}}
{{- define "ipvs-proxy.seconds" -}}
{{- $unit := dict "h" 3600.0 "m" 60.0 "s" 1.0 "ms" 0.001 "us" 0.000001 "µs" 0.000001 "ns" 0.000000001 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9.]+(ns|us|µs|ms|s|m|h)" . -1 -}}
{{- $n := regexFind "^[0-9.]+" . -}}
{{- $total = addf $total (mulf (float64 $n) (get $unit (trimPrefix $n .))) -}}
{{- end -}}
{{ $total }}
{{- end }}

{{/* An alert's labels: (list $ SEVERITY): its severity and values'
prometheusRule.ruleLabels. */}}
{{- define "ipvs-proxy.alertLabels" -}}
{{- $top := index . 0 -}}
severity: {{ index . 1 }}
{{- with $top.Values.prometheusRule.ruleLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}
