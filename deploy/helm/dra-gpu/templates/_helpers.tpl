{{/* Names and labels shared by every template. */}}

{{- define "dra-gpu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release> when it already contains the chart name, else <release>-<chart>. */}}
{{- define "dra-gpu.fullname" -}}
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

{{- define "dra-gpu.serviceAccountName" -}}
{{- default (include "dra-gpu.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{- define "dra-gpu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dra-gpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "dra-gpu.labels" -}}
{{ include "dra-gpu.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The per-node fake GPU map the driver reads (dra/fakegpu.py load_profile). */}}
{{- define "dra-gpu.fakeGpuMap" -}}
{{- toYaml (dict "default" .Values.fakeGpus.profile "nodes" .Values.fakeGpus.nodes) }}
{{- end }}

{{/* A DeviceClass CEL selector: this driver's devices of one type. */}}
{{- define "dra-gpu.deviceSelector" -}}
{{- $driver := .root.Values.driverName -}}
device.driver == "{{ $driver }}" && device.attributes["{{ $driver }}"].type == "{{ .type }}"
{{- end }}
