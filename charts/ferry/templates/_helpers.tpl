{{/* The chart name, or nameOverride. */}}
{{- define "ferry.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of object names: fullnameOverride, the release name when it contains the chart
name ("ferry" gives ferry-operator), or "<release>-<name>". */}}
{{- define "ferry.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "ferry.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "ferry.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ferry
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: call with (dict "ctx" $ "component" "operator"). */}}
{{- define "ferry.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ferry.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Labels of one component's objects. */}}
{{- define "ferry.componentLabels" -}}
{{ include "ferry.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "ferry.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (printf "%s-operator" (include "ferry.fullname" .)) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ferry.ticketNamespace" -}}
{{- default (printf "%s-tickets" .Release.Namespace) .Values.tickets.namespace }}
{{- end }}

{{- define "ferry.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create }}
{{- default (printf "%s-agent" (include "ferry.fullname" .)) .Values.agent.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.agent.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag or repository@digest. */}}
{{- define "ferry.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The kubelet directory without a trailing slash ("/" stays "/"), checked absolute. */}}
{{- define "ferry.kubeletDir" -}}
{{- $dir := .Values.kubeletDir | trimSuffix "/" }}
{{- if not (hasPrefix "/" $dir) }}
{{- fail (printf "kubeletDir must be an absolute path, got %q" .Values.kubeletDir) }}
{{- end }}
{{- $dir }}
{{- end }}

{{/* host:port for a component's endpoints (IPv6 hosts in brackets are passed as given). */}}
{{- define "ferry.listen" -}}
{{- printf "%s:%v" .ctx.Values.listenHost .port }}
{{- end }}

{{/* kube-score's checks that a component's values fail on purpose, comma-separated for its
kube-score/ignore annotation; each is a documented exception (charts/ferry/README.md,
"kube-score exceptions"), listed only while the values that cause it are set. Call with
(dict "ctx" $ "values" .Values.agent). */}}
{{- define "ferry.scoreExceptions" -}}
{{- $v := .values }}
{{- $ignore := list }}
{{- $sc := $v.securityContext | default dict }}
{{- if or $sc.privileged $v.privileged }}
{{- $ignore = append $ignore "container-security-context-privileged" }}
{{- end }}
{{- $psc := $v.podSecurityContext | default dict }}
{{- $uid := ternary $sc.runAsUser $psc.runAsUser (hasKey $sc "runAsUser") }}
{{- $gid := ternary $sc.runAsGroup $psc.runAsGroup (hasKey $sc "runAsGroup") }}
{{- if or (lt (int (default 0 $uid)) 10000) (lt (int (default 0 $gid)) 10000) }}
{{- $ignore = append $ignore "container-security-context-user-group-id" }}
{{- end }}
{{- $limits := ($v.resources | default dict).limits | default dict }}
{{- if not (and $limits.cpu $limits.memory) }}
{{- $ignore = append $ignore "container-resources" }}
{{- end }}
{{- if ne .ctx.Values.image.pullPolicy "Always" }}
{{- $ignore = append $ignore "container-image-pull-policy" }}
{{- end }}
{{- join "," $ignore }}
{{- end }}
