{{- define "meshcap.name" -}}meshcap{{- end -}}

{{- define "meshcap.labels" -}}
app.kubernetes.io/name: meshcap
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "meshcap.image" -}}{{ .Values.image.repository }}:{{ .Values.image.tag }}{{- end -}}

{{/* namespaces never redirected: the mesh's control plane, kube-system, meshcap's own, then the user's */}}
{{- define "meshcap.excludeNamespaces" -}}
{{- $profile := dict "istio" (list "kube-system" "istio-system") "linkerd" (list "kube-system" "linkerd" "linkerd-cni") -}}
{{- $base := get $profile .Values.profile | required "profile must be istio or linkerd" -}}
{{- concat $base (list .Release.Namespace) .Values.excludeNamespaces | uniq | join "," -}}
{{- end -}}
