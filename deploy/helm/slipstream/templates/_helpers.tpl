{{/*
Labels of every object. Call with (dict "root" $ "name" "slipstream-node"):
`name` is the part of Slipstream the object belongs to.
*/}}
{{- define "slipstream.labels" -}}
{{ include "slipstream.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: slipstream
{{- end }}

{{/* The labels a workload's selector matches (never change on upgrade). */}}
{{- define "slipstream.selectorLabels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end }}

{{/* The image every role runs: registry/repository:tag (tag defaults to appVersion). */}}
{{- define "slipstream.image" -}}
{{ .Values.image.registry }}/{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The control plane's Service name (the SAN of its serving certificate). */}}
{{- define "slipstream.controlHost" -}}
slipstream-control.{{ .Release.Namespace }}.svc
{{- end }}

{{/* The Secret holding the CA. */}}
{{- define "slipstream.caSecret" -}}
{{ .Values.ca.existingSecret | default "slipstream-ca" }}
{{- end }}
