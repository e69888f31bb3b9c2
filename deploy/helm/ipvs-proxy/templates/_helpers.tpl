{{/* The labels of every object, and the DaemonSet's selector. */}}
{{- define "ipvs-proxy.labels" -}}
app.kubernetes.io/name: ipvs-proxy
{{- end }}

{{/* The image of both containers: repository:tag, or repository@digest. */}}
{{- define "ipvs-proxy.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
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
