# syntax=docker/dockerfile:1
# sandbox-gateway image: build wheels in one stage, install them into a clean slim image.
#
#   docker build -t ghcr.io/example/sandbox-gateway:0.1.0 .
#   docker run --rm -p 8080:8080 -p 8081:8081 ghcr.io/example/sandbox-gateway:0.1.0
#
# Runs as uid/gid 10001 (numeric, so Kubernetes' runAsNonRoot can verify it) and works with a
# read-only root filesystem as long as /tmp and the data dir are writable (the Helm chart
# mounts emptyDirs there). Ports: 8080 data plane, 8081 control API + /healthz /readyz
# /metrics, 50051 gRPC (reserved, not served yet).

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the wheel needs (see .dockerignore); pyproject.toml names README.md as the readme.
COPY pyproject.toml README.md ./
COPY routing ./routing
COPY gateway ./gateway
# The project's wheel plus a wheel for every runtime dependency (all ship manylinux wheels,
# so no compiler is needed).
RUN pip wheel . --wheel-dir /wheels

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SANDBOX_GATEWAY_DATA_DIR=/var/lib/sandbox-gateway
RUN groupadd --system --gid 10001 sandbox-gateway \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
      --home-dir /var/lib/sandbox-gateway --shell /usr/sbin/nologin sandbox-gateway \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/sandbox-gateway /etc/sandbox-gateway
# Install from the builder's wheels only (no index): the image gets exactly what was built.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels sandbox-gateway \
 && sandbox-gateway --help >/dev/null
WORKDIR /var/lib/sandbox-gateway
USER 10001:10001
EXPOSE 8080 8081 50051
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8081/healthz', timeout=2)"]
ENTRYPOINT ["sandbox-gateway"]
CMD ["serve", "--host", "0.0.0.0"]
