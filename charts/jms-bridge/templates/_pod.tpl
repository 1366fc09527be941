{{/* The pod of the Deployment or the StatefulSet, indented as their spec.template */}}
{{- define "jms-bridge.podTemplate" }}
    metadata:
      labels:
        {{- include "jms-bridge.labels" . | nindent 8 }}
        {{- with .Values.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
        checksum/secret: {{ include (print $.Template.BasePath "/secret.yaml") . | sha256sum }}
        {{- with .Values.auth.secretChecksum }}
        checksum/existing-secret: {{ . | toString | sha256sum }}
        {{- end }}
        {{- if .Values.metrics.enabled }}
        {{- tpl (toYaml .Values.metrics.podAnnotations) . | nindent 8 }}
        {{- end }}
        {{- with .Values.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "jms-bridge.serviceAccountName" . }}
      automountServiceAccountToken: {{ .Values.serviceAccount.automountServiceAccountToken }}
      {{- with .Values.image.pullSecrets }}
      imagePullSecrets:
        {{- range . }}
        - name: {{ . }}
        {{- end }}
      {{- end }}
      {{- with .Values.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- if .Values.podSecurityContext.enabled }}
      securityContext:
        {{- toYaml (omit .Values.podSecurityContext "enabled") | nindent 8 }}
      {{- end }}
      terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
      {{- if .Values.affinity }}
      affinity:
        {{- toYaml .Values.affinity | nindent 8 }}
      {{- else if .Values.podAntiAffinityPreset }}
      affinity:
        podAntiAffinity:
          {{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (include "jms-bridge.selectorLabels" . | fromYaml)) }}
          {{- if eq .Values.podAntiAffinityPreset "hard" }}
          requiredDuringSchedulingIgnoredDuringExecution:
            {{- toYaml (list $term) | nindent 12 }}
          {{- else }}
          preferredDuringSchedulingIgnoredDuringExecution:
            {{- toYaml (list (dict "weight" 1 "podAffinityTerm" $term)) | nindent 12 }}
          {{- end }}
      {{- end }}
      {{- with .Values.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.topologySpreadConstraints }}
      topologySpreadConstraints:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.initContainers }}
      initContainers:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - name: jms-bridge
          image: {{ include "jms-bridge.image" . }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          {{- with .Values.command }}
          command:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with .Values.args }}
          args:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- if .Values.containerSecurityContext.enabled }}
          securityContext:
            {{- toYaml (omit .Values.containerSecurityContext "enabled") | nindent 12 }}
          {{- end }}
          {{- $env := include "jms-bridge.env" . }}
          {{- if $env }}
          env:
            {{- $env | trim | nindent 12 }}
          {{- end }}
          {{- with .Values.extraEnvFrom }}
          envFrom:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          ports:
            - name: stomp
              containerPort: {{ .Values.containerPorts.stomp }}
              protocol: TCP
            {{- if or .Values.service.amqpPortEnabled .Values.bridge.amqpListen }}
            - name: amqp
              containerPort: {{ .Values.containerPorts.amqp }}
              protocol: TCP
            {{- end }}
            {{- if include "jms-bridge.stompTls" . }}
            - name: stomp-tls
              containerPort: {{ .Values.containerPorts.stompTls }}
              protocol: TCP
            {{- end }}
            {{- if include "jms-bridge.amqpTls" . }}
            - name: amqp-tls
              containerPort: {{ .Values.containerPorts.amqpTls }}
              protocol: TCP
            {{- end }}
            - name: admin
              containerPort: {{ .Values.containerPorts.admin }}
              protocol: TCP
          {{- if .Values.customStartupProbe }}
          startupProbe:
            {{- toYaml .Values.customStartupProbe | nindent 12 }}
          {{- else if .Values.startupProbe.enabled }}
          startupProbe:
            {{- /* /readyz: the broker reached, not only the process up */}}
            {{- include "jms-bridge.probe" (dict "probe" .Values.startupProbe "path" "/readyz") | nindent 12 }}
          {{- end }}
          {{- if .Values.customLivenessProbe }}
          livenessProbe:
            {{- toYaml .Values.customLivenessProbe | nindent 12 }}
          {{- else if .Values.livenessProbe.enabled }}
          livenessProbe:
            {{- include "jms-bridge.probe" (dict "probe" .Values.livenessProbe "path" "/healthz") | nindent 12 }}
          {{- end }}
          {{- if .Values.customReadinessProbe }}
          readinessProbe:
            {{- toYaml .Values.customReadinessProbe | nindent 12 }}
          {{- else if .Values.readinessProbe.enabled }}
          readinessProbe:
            {{- include "jms-bridge.probe" (dict "probe" .Values.readinessProbe "path" "/readyz") | nindent 12 }}
          {{- end }}
          {{- if .Values.preStopDelaySeconds }}
          lifecycle:
            preStop:
              exec:
                command: ["sleep", "{{ .Values.preStopDelaySeconds }}"]
          {{- end }}
          {{- with .Values.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          volumeMounts:
            - name: config
              mountPath: /etc/jms-bridge
              readOnly: true
            - name: tmp
              mountPath: /tmp
            {{- if .Values.adminToken.existingSecret }}
            - name: admin-token
              mountPath: /etc/jms-bridge-admin
              readOnly: true
            {{- end }}
            {{- if .Values.tls.enabled }}
            {{- /* the whole directory, never a subPath: a renewed certificate must reach the pod */}}
            - name: tls
              mountPath: {{ include "jms-bridge.tlsDir" . }}
              readOnly: true
            {{- end }}
            {{- if .Values.persistence.enabled }}
            - name: data
              mountPath: {{ .Values.persistence.mountPath }}
            {{- end }}
            {{- with .Values.extraVolumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
        {{- with .Values.sidecars }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      volumes:
        - name: config
          configMap:
            name: {{ include "jms-bridge.configMapName" . }}
        - name: tmp
          {{- if .Values.tmpDir.sizeLimit }}
          emptyDir:
            sizeLimit: {{ .Values.tmpDir.sizeLimit }}
          {{- else }}
          emptyDir: {}
          {{- end }}
        {{- if .Values.adminToken.existingSecret }}
        - name: admin-token
          secret:
            secretName: {{ .Values.adminToken.existingSecret }}
            items:
              - key: {{ .Values.adminToken.key }}
                path: token
        {{- end }}
        {{- if .Values.tls.enabled }}
        - name: tls
          secret:
            secretName: {{ .Values.tls.secretName }}
        {{- end }}
        {{- with .Values.extraVolumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
{{- end }}
