{{- define "cqw.name" -}}
{{- printf "%s" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "cqw.labels" -}}
app.kubernetes.io/name: card-quota-webhook
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "cqw.selector" -}}
app.kubernetes.io/name: card-quota-webhook
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cqw.secret" -}}
{{- if eq .Values.certs.mode "provided" -}}{{ .Values.certs.secretName }}{{- else -}}{{ include "cqw.name" . }}-tls{{- end -}}
{{- end -}}

{{- define "cqw.dnsNames" -}}
{{- $svc := include "cqw.name" . -}}
{{- $names := list $svc (printf "%s.%s" $svc .Release.Namespace) (printf "%s.%s.svc" $svc .Release.Namespace) (printf "%s.%s.svc.cluster.local" $svc .Release.Namespace) -}}
{{- concat $names .Values.certs.extraDNSNames | toJson -}}
{{- end -}}

{{/* A pod (or a workload's pod template) that names a card or requests a card resource. */}}
{{- define "cqw.cardPod" -}}
{{- $prefixes := .Values.webhook.cardResourcePrefixes | toJson -}}
{{- $wants := printf "(has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(r, %s.exists(p, r.startsWith(p)))) || (has(c.resources.requests) && c.resources.requests.exists(r, %s.exists(p, r.startsWith(p))))))" $prefixes $prefixes -}}
{{- printf "(has(%s.metadata.annotations) && 'volcano.sh/card.name' in %s.metadata.annotations) || %s.spec.containers.exists(c, %s) || (has(%s.spec.initContainers) && %s.spec.initContainers.exists(c, %s)) || (has(%s.spec.resourceClaims) && size(%s.spec.resourceClaims) > 0)" .pod .pod .pod $wants .pod .pod $wants .pod .pod -}}
{{- end -}}

{{/* What the validating webhook is sent: card pods, and with the CPU/memory check on, every pod
the Volcano schedulers schedule. .pod is the CEL path of the pod or pod template. */}}
{{- define "cqw.checkedPod" -}}
{{- $card := include "cqw.cardPod" . -}}
{{- if .Values.cpuMemoryCheck.enabled -}}
{{- printf "(%s) || (has(%s.spec.schedulerName) && %s.spec.schedulerName in %s)" $card .pod .pod (.Values.cpuMemoryCheck.schedulerNames | toJson) -}}
{{- else -}}
{{- $card -}}
{{- end -}}
{{- end -}}

{{- define "cqw.clientConfig" -}}
{{- if .Values.webhook.url }}
url: {{ printf "%s%s" (trimSuffix "/" .Values.webhook.url) .path | quote }}
{{- else }}
service:
  name: {{ include "cqw.name" . }}
  namespace: {{ .Release.Namespace }}
  path: {{ .path | quote }}
  port: {{ .Values.service.port }}
{{- end }}
{{- if eq .Values.certs.mode "provided" }}
caBundle: {{ .Values.certs.caBundle | quote }}
{{- else if eq .Values.certs.mode "self-signed" }}
caBundle: {{ .caBundle | quote }}
{{- end }}
{{- end -}}

{{- define "cqw.namespaceSelector" -}}
namespaceSelector:
  {{- with .Values.webhook.namespaceLabels }}
  matchLabels: {{- toYaml . | nindent 4 }}
  {{- end }}
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: {{ concat (list .Release.Namespace "kube-system" "kube-node-lease") .Values.webhook.excludeNamespaces | uniq | toJson }}
{{- end -}}

{{/* The user the webhook writes as: its ServiceAccount in the cluster, or webhook.username for a
server run outside it (URL mode) with credentials of its own. */}}
{{- define "cqw.username" -}}
{{- .Values.webhook.username | default (printf "system:serviceaccount:%s:%s" .Release.Namespace (include "cqw.name" .)) -}}
{{- end -}}

{{/* A map as "key=value,key=value" (sorted), the form of the server's mapping settings. */}}
{{- define "cqw.pairs" -}}
{{- $out := list -}}
{{- range $k, $v := . }}{{ $out = append $out (printf "%s=%v" $k $v) }}{{ end -}}
{{- join "," $out -}}
{{- end -}}

{{/* CEL: the update removes the webhook's scheduling gate from the pod (SPEC §5c). */}}
{{- define "cqw.gateRemoved" -}}
{{- $has := "has(%s.spec.schedulingGates) && %s.spec.schedulingGates.exists(g, g.name == 'cardquota.volcano.sh/waiting')" -}}
{{- printf "(%s) && !(%s)" (printf $has "oldObject" "oldObject") (printf $has "object" "object") -}}
{{- end }}

{{/* CEL: the update edits an annotation a pod's charge is read from (its card, its queue), or
names or renames its PodGroup (SPEC §4b: a charge lives as long as its pod; the PodGroup named must
be in the queue it is charged to). */}}
{{- define "cqw.chargeEdited" -}}
{{- $value := "(has(%s.metadata.annotations) && '%s' in %s.metadata.annotations ? %s.metadata.annotations['%s'] : '')" -}}
{{- $edits := list -}}
{{- range list "volcano.sh/card.name" "cardquota.volcano.sh/card" "cardquota.volcano.sh/card.spec" "scheduling.volcano.sh/queue-name" -}}
{{- $edits = append $edits (printf "%s != %s" (printf $value "object" . "object" "object" .) (printf $value "oldObject" . "oldObject" "oldObject" .)) -}}
{{- end -}}
{{- $group := "scheduling.k8s.io/group-name" -}}
{{- $edits = append $edits (printf "%s != %s" (printf $value "object" $group "object" "object" $group) (printf $value "oldObject" $group "oldObject" "oldObject" $group)) -}}
{{- join " || " $edits -}}
{{- end }}

{{/* A PodGroup UPDATE that moves it into a phase that reserves cards (the enqueue gate). */}}
{{- define "cqw.enqueued" -}}
{{- $in := "has(%s.status) && has(%s.status.phase) && %s.status.phase in ['Inqueue', 'Running']" -}}
{{- printf "(%s) && !(%s)" (printf $in "object" "object" "object") (printf $in "oldObject" "oldObject" "oldObject") -}}
{{- end }}

{{/* A PodGroup UPDATE that edits what an enqueued PodGroup's reservation is read from: its
card.request, card.name, queue or minResources (SPEC §4b). */}}
{{- define "cqw.requestEdited" -}}
{{- $in := "has(oldObject.status) && has(oldObject.status.phase) && oldObject.status.phase in ['Inqueue', 'Running']" -}}
{{- $value := "(has(%s.metadata.annotations) && '%s' in %s.metadata.annotations ? %s.metadata.annotations['%s'] : '')" -}}
{{- $edits := list "(has(object.spec.queue) ? object.spec.queue : '') != (has(oldObject.spec.queue) ? oldObject.spec.queue : '')" "(has(object.spec.minResources) ? object.spec.minResources : {}) != (has(oldObject.spec.minResources) ? oldObject.spec.minResources : {})" -}}
{{- range list "volcano.sh/card.request" "volcano.sh/card.name" -}}
{{- $edits = append $edits (printf "%s != %s" (printf $value "object" . "object" "object" .) (printf $value "oldObject" . "oldObject" "oldObject" .)) -}}
{{- end -}}
{{- printf "(%s) && (%s)" $in (join " || " $edits) -}}
{{- end }}

{{/* A PodGroup UPDATE that moves it to another queue, in any phase (its pods' charges would move). */}}
{{- define "cqw.queueMoved" -}}
(has(object.spec.queue) ? object.spec.queue : '') != (has(oldObject.spec.queue) ? oldObject.spec.queue : '')
{{- end }}

{{/* A PodGroup with card demand: the PodGroup mutation gives every card PodGroup these. */}}
{{- define "cqw.cardPodGroup" -}}
has(object.metadata.annotations) && ('volcano.sh/card.request' in object.metadata.annotations || 'volcano.sh/card.name' in object.metadata.annotations)
{{- end }}

{{/* An UPDATE of a PodGroup that has card demand now or had it before (an edit stripping its card
annotations is sent too). */}}
{{- define "cqw.cardPodGroupBefore" -}}
{{- $card := "has(%s.metadata.annotations) && ('volcano.sh/card.request' in %s.metadata.annotations || 'volcano.sh/card.name' in %s.metadata.annotations)" -}}
{{- printf "(%s) || (%s)" (printf $card "object" "object" "object") (printf $card "oldObject" "oldObject" "oldObject") -}}
{{- end }}

{{/* A ResourceClaim made for a pod: from its template by the resource claim controller, or for an
extended resource by the scheduler; both name the pod as controlling owner. */}}
{{- define "cqw.podClaim" -}}
has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(r, r.kind == 'Pod' && has(r.controller) && r.controller)
{{- end }}

{{/* A ResourceClaim status UPDATE that writes a new allocation giving devices of a GPU driver. */}}
{{- define "cqw.gpuAllocation" -}}
{{- $drivers := dig "drivers" (list "gpu.nvidia.com") (.Values.dra | default dict) | toJson -}}
{{- $has := "has(%s.status) && has(%s.status.allocation) && has(%s.status.allocation.devices) && has(%s.status.allocation.devices.results)" -}}
{{- printf "(%s) && object.status.allocation.devices.results.exists(r, r.driver in %s) && (!(%s) || oldObject.status.allocation != object.status.allocation)" (printf $has "object" "object" "object" "object") $drivers (printf $has "oldObject" "oldObject" "oldObject" "oldObject") -}}
{{- end }}

{{- define "cqw.dra" -}}
{{- if dig "drivers" (list "gpu.nvidia.com") (.Values.dra | default dict) }}on{{ end -}}
{{- end }}
