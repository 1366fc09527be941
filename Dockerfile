# syntax=docker/dockerfile:1
# The jms-bridge image: `docker build -t jms-bridge:0.1.0 .` (see docs/kubernetes.md).
# Stage 1 builds wheels of the project and its runtime dependencies; stage 2 installs only
# those, from the wheels, and keeps neither the wheels, pip's cache nor any build tool.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml setup.cfg README.md ./
COPY bridge/ bridge/
COPY adapters/ adapters/
COPY policies/ policies/
RUN pip wheel --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
LABEL org.opencontainers.image.title="jms-bridge" \
      org.opencontainers.image.description="STOMP sidecar giving RabbitMQ and ActiveMQ JMS-style delivery delay" \
      org.opencontainers.image.licenses="Apache-2.0"
# A fixed uid and gid, 10001: the Helm chart's securityContext runs the pod as that user.
RUN groupadd --system --gid 10001 jms-bridge \
 && useradd --system --uid 10001 --gid jms-bridge --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin jms-bridge
# The wheels are bind-mounted from the build stage, so none of them is left in a layer; pip,
# setuptools and wheel go once the bridge is installed (nothing it runs needs them).
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels /wheels/jms_bridge-*.whl \
 && pip uninstall --yes pip setuptools wheel
COPY docker/config.yaml /etc/jms-bridge/config.yaml
USER 10001:10001
WORKDIR /tmp
# STOMP (applications), AMQP 0-9-1 (the AMQP listener, when amqp-listen is set), admin HTTP.
EXPOSE 61633 5673 9613
HEALTHCHECK --interval=30s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9613/healthz', timeout=2)"]
ENTRYPOINT ["jms-bridge", "run", "--config", "/etc/jms-bridge/config.yaml"]
