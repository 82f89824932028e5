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

{{/* Environment both containers share: the node, the paths, logging, the GPU split, NVML access. */}}
{{- define "dra-gpu.commonEnv" -}}
- name: DRA_GPU_NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: DRA_GPU_DRIVER_NAME
  value: {{ .Values.driverName | quote }}
- name: DRA_GPU_KUBELET_ROOT
  value: {{ .Values.kubeletDir | quote }}
- name: DRA_GPU_CDI_ROOT
  value: {{ .Values.cdiDir | quote }}
- name: DRA_GPU_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: DRA_GPU_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
{{- with .Values.gpuAssignment.dra }}
- name: DRA_GPU_DRA_GPUS
  value: {{ . | quote }}
{{- end }}
{{- with .Values.gpuAssignment.devicePlugin }}
- name: DRA_GPU_DEVICE_PLUGIN_GPUS
  value: {{ . | quote }}
{{- end }}
{{- if or (ne .Values.mig.mode "static") .Values.mig.nodes }}
# How GPUs' MIG is published (--mig-mode): the default, then @<node>=<mode> per listed node.
- name: DRA_GPU_MIG_MODE
  value: {{ include "dra-gpu.migMode" . | quote }}
{{- end }}
{{- if or (ne .Values.mig.profiles "common") .Values.mig.profileNodes }}
# Which MIG profiles dynamic-MIG GPUs offer (--mig-profiles): the default, then @<node>=<profile>.
- name: DRA_GPU_MIG_PROFILES
  value: {{ include "dra-gpu.migProfiles" . | quote }}
{{- end }}
{{- if not .Values.fakeGpus.enabled }}
# Which /dev/nvidia* nodes exist is read from the host's /dev: the toolkit injects only some of
# them into this container (no nvidia-uvm, no MIG capability nodes with "utility").
- name: DRA_GPU_HOST_ROOT
  value: /host
- name: DRA_GPU_CDI_DRIVER_FILES
  value: {{ .Values.driverFiles.enabled | quote }}
- name: DRA_GPU_DRIVER_ROOT
  value: {{ .Values.driverFiles.root | quote }}
{{- end }}
{{- with .Values.driverFiles.nvidiaCdiHookPath }}
- name: DRA_GPU_NVIDIA_CDI_HOOK_PATH
  value: {{ . | quote }}
{{- end }}
{{- if and (not .Values.fakeGpus.enabled) .Values.nvml.toolkitEnv }}
# The NVIDIA Container Toolkit injects every GPU, NVML and nvidia-smi ("utility"), and the CUDA
# driver with nvidia-cuda-mps-control ("compute"), which runs the claims' MPS daemons.
- name: NVIDIA_VISIBLE_DEVICES
  value: all
- name: NVIDIA_DRIVER_CAPABILITIES
  value: compute,utility
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* uid 0 for the root-owned host directories, but no capability and no escalation (see the pod's securityContext). */}}
{{- define "dra-gpu.containerSecurityContext" -}}
privileged: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end }}

{{/* Mounts both containers have: the CDI directory, a scratch /tmp, fake GPUs, extras. */}}
{{- define "dra-gpu.sharedMounts" -}}
- name: cdi
  mountPath: {{ .Values.cdiDir }}
- name: tmp
  mountPath: /tmp
{{- if .Values.fakeGpus.enabled }}
- name: fake-gpus
  mountPath: /etc/dra-gpu/fake-gpus
  readOnly: true
{{- else }}
- name: host-dev
  mountPath: /host/dev
  readOnly: true
{{- if and .Values.driverFiles.enabled (include "dra-gpu.driverRootWhole" .) }}
- name: driver-root
  mountPath: {{ include "dra-gpu.driverRootMount" . }}
  readOnly: true
  # A driver container's root is mounted after the plugin starts: its files must reach it then.
  mountPropagation: HostToContainer
{{- else if .Values.driverFiles.enabled }}
{{- range $dir := concat (include "dra-gpu.driverFileDirs" . | fromJsonArray) (include "dra-gpu.driverIpcDirs" . | fromJsonArray) }}
- name: {{ include "dra-gpu.driverVolume" $dir }}
  mountPath: {{ printf "%s/%s" (include "dra-gpu.driverRootMount" $) $dir }}
  readOnly: true
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The ConfigMap holding the device plugin's config file: the chart's own (config.data), the admin's (config.name), or "". */}}
{{- define "dra-gpu.devicePluginConfigMap" -}}
{{- $config := .Values.devicePlugin.config }}
{{- if and $config.data $config.name }}
{{- fail "devicePlugin.config: set data (the chart makes the ConfigMap) or name (an existing ConfigMap), not both" }}
{{- end }}
{{- if and .Values.devicePlugin.enabled $config.data }}
{{- printf "%s-device-plugin-config" (include "dra-gpu.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- else if .Values.devicePlugin.enabled }}
{{- $config.name }}
{{- end }}
{{- end }}

{{/* The admin label scheme as --label-template's value: key=template pairs, sorted by key. */}}
{{- define "dra-gpu.labelTemplate" -}}
{{- $pairs := list }}
{{- range $key, $template := .Values.nodeLabeller.adminLabels }}
{{- $pairs = append $pairs (printf "%s=%s" $key $template) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}

{{/* "true" where the kubelet plugin applies static MIG layouts (mig.configs): their ConfigMap, and
the rights to follow the Node's nvidia.com/mig.config label and set its state label, go with it. */}}
{{- define "dra-gpu.migLayouts" -}}
{{- if and .Values.kubeletPlugin.enabled .Values.mig.configs }}true{{ end }}
{{- end }}

{{/* The --mig-mode value: the default mode, then one @<node>=<mode> per entry of mig.nodes. */}}
{{- define "dra-gpu.migMode" -}}
{{ .Values.mig.mode }}{{ range $node, $mode := .Values.mig.nodes }},@{{ $node }}={{ $mode }}{{ end }}
{{- end }}

{{/* The --mig-profiles value: mig.profiles, then @<node>=<item> per item of mig.profileNodes. */}}
{{- define "dra-gpu.migProfiles" -}}
{{ .Values.mig.profiles }}{{ range $node, $items := .Values.mig.profileNodes }}{{ range (kindIs "slice" $items | ternary $items (list $items)) }},@{{ $node }}={{ . }}{{ end }}{{ end }}
{{- end }}

{{/* The webhook's match condition: the object carries an opaque config for this driver,
wherever its kind keeps configs (claim, template, DeviceClass). */}}
{{- define "dra-gpu.webhookMatch" -}}
{{- $has := printf "exists(c, has(c.opaque) && c.opaque.driver == '%s')" .Values.driverName -}}
has(object.spec) && (
(has(object.spec.config) && object.spec.config.{{ $has }}) ||
(has(object.spec.devices) && has(object.spec.devices.config) && object.spec.devices.config.{{ $has }}) ||
(has(object.spec.spec) && has(object.spec.spec.devices) && has(object.spec.spec.devices.config) && object.spec.spec.devices.config.{{ $has }}))
{{- end }}

{{/* The label keys the node labeller writes (dra.core.labels.STATIC_KEYS, and MIG_KEY for each
MIG profile's; a test compares): its policy lets it change these and no other nvidia.com/ key. */}}
{{- define "dra-gpu.labellerKeys" -}}
["nvidia.com/cuda.driver-version.full", "nvidia.com/cuda.driver-version.major", "nvidia.com/cuda.driver-version.minor", "nvidia.com/cuda.driver-version.revision", "nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev", "nvidia.com/cuda.runtime-version.full", "nvidia.com/cuda.runtime-version.major", "nvidia.com/cuda.runtime-version.minor", "nvidia.com/cuda.runtime.major", "nvidia.com/cuda.runtime.minor", "nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor", "nvidia.com/gpu.count", "nvidia.com/gpu.engines.copy", "nvidia.com/gpu.engines.decoder", "nvidia.com/gpu.engines.encoder", "nvidia.com/gpu.engines.jpeg", "nvidia.com/gpu.engines.ofa", "nvidia.com/gpu.family", "nvidia.com/gpu.memory", "nvidia.com/gpu.multiprocessors", "nvidia.com/gpu.present", "nvidia.com/gpu.product", "nvidia.com/gpu.replicas", "nvidia.com/gpu.sharing-strategy", "nvidia.com/gpu.slices.ci", "nvidia.com/gpu.slices.gi", "nvidia.com/mig.strategy"]
{{- end }}
{{- define "dra-gpu.labellerMigKey" -}}
^nvidia\.com/mig-[A-Za-z0-9][-A-Za-z0-9_.]*\.(count|memory|multiprocessors|slices\.gi|slices\.ci|engines\.copy|engines\.decoder|engines\.encoder|engines\.jpeg|engines\.ofa)$
{{- end }}

{{/* What of the driver root the driver reads (dra.gpu.driverfiles.FILE_DIRS and IPC_DIRS; a test
compares): mounted one by one, never the root itself, which on a host install is the host's /. */}}
{{- define "dra-gpu.driverFileDirs" -}}
["usr", "lib", "bin", "sbin"]
{{- end }}
{{- define "dra-gpu.driverIpcDirs" -}}
["var/run/nvidia-persistenced", "var/run/nvidia-fabricmanager", "tmp/nvidia-mps"]
{{- end }}

{{/* Whether the driver root is mounted whole: any root but the host's / is the driver's own
directory (the GPU Operator's /run/nvidia/driver, GKE's bin + lib64 layout at /usr/local/nvidia),
with nothing of the host's in it and no directory layout to assume. "" when not. */}}
{{- define "dra-gpu.driverRootWhole" -}}
{{- if ne (clean .Values.driverFiles.root) "/" }}true{{ end -}}
{{- end }}

{{/* The volume of one driver directory: driver-usr, driver-var-run-nvidia-persistenced. */}}
{{- define "dra-gpu.driverVolume" -}}
{{- printf "driver-%s" (. | replace "/" "-") -}}
{{- end }}

{{/* Where the host's driver root appears in the containers: under --host-root (/host). */}}
{{- define "dra-gpu.driverRootMount" -}}
{{- printf "/host%s" (trimSuffix "/" (clean .Values.driverFiles.root)) -}}
{{- end }}

{{/* The kubelet's device-plugin directory: a constant of the kubelet (the device-plugin API's
DevicePluginPath), the same whatever its --root-dir, so not under kubeletDir. */}}
{{- define "dra-gpu.devicePluginDir" -}}
/var/lib/kubelet/device-plugins
{{- end }}
