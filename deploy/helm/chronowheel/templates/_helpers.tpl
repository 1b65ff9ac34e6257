{{- define "chronowheel.fullname" -}}
{{- printf "%s-chronowheel" .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{- define "chronowheel.labels" -}}
app.kubernetes.io/name: chronowheel
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "chronowheel.selector" -}}
app.kubernetes.io/name: chronowheel
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "chronowheel.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Settings and secret references as CHRONOWHEEL_* variables. */}}
{{- define "chronowheel.env" -}}
- name: CHRONOWHEEL_NAMESPACE
  value: {{ .Values.namespace | quote }}
- name: CHRONOWHEEL_KAFKA
  value: {{ .Values.kafka | quote }}
- name: CHRONOWHEEL_CASSANDRA
  value: {{ .Values.cassandra | quote }}
- name: CHRONOWHEEL_CONSISTENCY
  value: {{ .Values.consistency | quote }}
- name: CHRONOWHEEL_SHARDS
  value: {{ .Values.shards | quote }}
- name: CHRONOWHEEL_REPLICATION
  value: {{ .Values.replication | quote }}
- name: CHRONOWHEEL_HTTP_PORT
  value: {{ .Values.httpPort | quote }}
- name: CHRONOWHEEL_HTTP_HOST
  value: "0.0.0.0"
{{- range $name, $value := .Values.config }}
- name: CHRONOWHEEL_{{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- range $name, $value := .Values.env }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- range $setting, $ref := dict "KAFKA_SASL_PASSWORD" .Values.secrets.kafkaSaslPassword "KAFKA_SSL_KEY_PASSWORD" .Values.secrets.kafkaSslKeyPassword "CASSANDRA_PASSWORD" .Values.secrets.cassandraPassword "CASSANDRA_SSL_KEY_PASSWORD" .Values.secrets.cassandraSslKeyPassword "HTTP_TOKEN" .Values.secrets.httpToken }}
{{- if $ref.name }}
- name: CHRONOWHEEL_{{ $setting }}
  valueFrom:
    secretKeyRef:
      name: {{ $ref.name }}
      key: {{ $ref.key }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "chronowheel.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.tlsSecret }}
- name: tls
  mountPath: /etc/chronowheel/tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "chronowheel.volumes" -}}
- name: tmp
  emptyDir: {}
{{- if .Values.tlsSecret }}
- name: tls
  secret:
    secretName: {{ .Values.tlsSecret }}
{{- end }}
{{- end -}}

{{- define "chronowheel.probes" -}}
readinessProbe:
  httpGet: {path: /healthz, port: http}
  {{- toYaml .Values.probes.readiness | nindent 2 }}
livenessProbe:
  httpGet: {path: /healthz/live, port: http}
  {{- toYaml .Values.probes.liveness | nindent 2 }}
{{- end -}}
