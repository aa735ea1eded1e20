{{/* The release's name prefix: "quota-lease" for a release of that name. */}}
{{- define "quota-lease.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "quota-lease.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: include with (list . "coordinator"). */}}
{{- define "quota-lease.selector" -}}
app.kubernetes.io/name: {{ (index . 0).Chart.Name }}
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* A component's image: include with (list . "coordinator"). Never :latest. */}}
{{- define "quota-lease.image" -}}
{{- $root := index . 0 -}}
{{- $tag := $root.Values.image.tag | default $root.Chart.AppVersion -}}
{{- if eq $tag "latest" -}}{{- fail "image.tag latest is refused: pin a version" -}}{{- end -}}
{{- printf "%s/%s:%s" $root.Values.image.registry (index . 1) $tag -}}
{{- end -}}

{{- define "quota-lease.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "quota-lease.fullname" .) -}}
{{- end -}}

{{/* Pod annotations for annotation-based scraping of /metrics on 7401 or 7501. */}}
{{- define "quota-lease.scrape" -}}
{{- if (index . 0).Values.scrapeAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/scheme: https
prometheus.io/port: {{ index . 1 | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}
