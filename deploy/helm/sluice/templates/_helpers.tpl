{{- define "sluice.fullname" -}}
{{- printf "%s-sluice" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sluice.headless" -}}
{{- printf "%s-headless" (include "sluice.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sluice.labels" -}}
app.kubernetes.io/name: sluice
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "sluice.selector" -}}
app.kubernetes.io/name: sluice
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The Kafka port's protocol, from tls.enabled and sasl.enabled. */}}
{{- define "sluice.protocol" -}}
{{- if and .Values.sasl.enabled .Values.tls.enabled -}}SASL_SSL
{{- else if .Values.sasl.enabled -}}SASL_PLAINTEXT
{{- else if .Values.tls.enabled -}}SSL
{{- else -}}PLAINTEXT
{{- end -}}
{{- end -}}

{{/* id@host:port of every pod's controller: pod i is node i+1. */}}
{{- define "sluice.voters" -}}
{{- $voters := list -}}
{{- range $i := until (int .Values.replicas) -}}
{{- $voters = append $voters (printf "%d@%s-%d.%s.%s.svc:%d" (add $i 1) (include "sluice.fullname" $) $i (include "sluice.headless" $) $.Release.Namespace (int $.Values.ports.controller)) -}}
{{- end -}}
{{- join "," $voters -}}
{{- end -}}

{{- define "sluice.clusterSecretName" -}}
{{- default (printf "%s-cluster" (include "sluice.fullname" .)) .Values.clusterSecret.existingSecret -}}
{{- end -}}
