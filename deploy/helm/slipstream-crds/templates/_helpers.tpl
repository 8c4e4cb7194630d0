{{/*
Labels of every object this chart renders itself (the vendored Gateway API
definitions keep upstream's metadata, plus the keep annotation).
*/}}
{{- define "slipstream-crds.labels" -}}
app.kubernetes.io/name: slipstream-crds
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: slipstream
{{- end }}

{{/*
A minimal namespaced CRD of our own: any spec and status are kept as
written (x-kubernetes-preserve-unknown-fields); the control plane reads and
checks them, and says what it refuses. Arguments (a dict):
  root       the chart's context ($)
  group      API group
  kind       Kind; listKind is Kind + "List"
  plural     resource name
  shortNames list (may be empty)
  categories list (may be empty)
  versions   served versions
  storage    the one version stored
*/}}
{{- define "slipstream-crds.minimal" -}}
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {{ .plural }}.{{ .group }}
  annotations:
    # Uninstalling the chart must never delete users' objects of this kind.
    helm.sh/resource-policy: keep
  labels:
    {{- include "slipstream-crds.labels" .root | nindent 4 }}
spec:
  group: {{ .group }}
  scope: Namespaced
  names:
    kind: {{ .kind }}
    listKind: {{ .kind }}List
    plural: {{ .plural }}
    singular: {{ lower .kind }}
    {{- with .shortNames }}
    shortNames: {{ toJson . }}
    {{- end }}
    {{- with .categories }}
    categories: {{ toJson . }}
    {{- end }}
  versions:
    {{- range .versions }}
    - name: {{ . }}
      served: true
      storage: {{ eq . $.storage }}
      subresources:
        status: {}
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              x-kubernetes-preserve-unknown-fields: true
            status:
              type: object
              x-kubernetes-preserve-unknown-fields: true
    {{- end }}
{{- end }}
