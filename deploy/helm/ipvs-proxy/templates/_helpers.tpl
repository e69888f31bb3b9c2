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

{{/* The options of both containers' commands after the subcommand. */}}
{{- define "ipvs-proxy.args" -}}
- --config=/etc/ipvs-proxy/config.yaml
- --hostname-override=$(NODE_NAME)
{{- end }}
