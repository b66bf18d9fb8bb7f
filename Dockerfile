# syntax=docker/dockerfile:1
# sandbox-gateway image: install into a virtualenv in one stage, copy the virtualenv into a
# clean image of the same base.
#
#   scripts/build-image                     # docker or podman build, base python:3.11-slim
#   scripts/build-image --base-rootfs       # offline base: a Debian rootfs made with debootstrap
#   scripts/smoke-image                     # run it read-only and non-root, serve one request
#
# PYTHON_IMAGE is any Debian-based image with python3 (>= 3.11) and its venv module: the
# official python:3.11-slim by default, or the local base scripts/build-image --base-rootfs
# imports. A virtualenv (not the base's site-packages) because it is the same in both: Debian's
# own python3 refuses `pip install` outside a virtualenv (PEP 668), and the runtime stage then
# needs no pip at all.
#
# Runs as uid/gid 10001 (numeric, so Kubernetes' runAsNonRoot can verify it) and works with a
# read-only root filesystem as long as /tmp and the data dir are writable (the Helm chart
# mounts emptyDirs there; scripts/smoke-image mounts tmpfs). Ports: 8080 data plane, 8081
# control API + /healthz /readyz /metrics, 50051 gRPC (the gRPC front, h2c).

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the wheel needs (see .dockerignore); pyproject.toml names README.md as the readme.
COPY pyproject.toml setup.py README.md ./
COPY routing ./routing
COPY gateway ./gateway
# Every runtime dependency ships manylinux wheels; the compiler is for the gateway's own compiled
# data plane (setup.py, Cython), and stays in this stage: the runtime stage copies the built
# virtualenv only. Cython's C needs Python's headers too: python:3.11-slim has them, Debian's
# python3 (the --base-rootfs base) does not, so python3-dev comes along where Python.h is missing.
# Where apt cannot install them, the image runs the pure-Python data plane (the gateway logs which
# at startup). But with a compiler here the build must compile it: setup.py never fails an install
# (a failed module prints a warning pip hides and installs Python), which once shipped a
# pure-Python image unnoticed, so the last step prints the data plane and fails unless compiled.
# pip and setuptools leave the virtualenv once it is built: the running gateway installs nothing.
# Behind a TLS-inspecting proxy, pass its CA bundle as the build secret pip-ca (scripts/build-image
# --ca-bundle FILE): a secret is mounted for this step only and never lands in a layer.
RUN --mount=type=secret,id=pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
 && packages="gcc libc6-dev" \
 && if [ ! -e "$(python3 -c 'import sysconfig; print(sysconfig.get_path("include"))')/Python.h" ]; then \
      packages="$packages python3-dev"; fi \
 && { (apt-get update -qq && apt-get install -y -qq --no-install-recommends $packages >/dev/null) \
      || echo "no C compiler: the image runs the pure-Python data plane"; } \
 && python3 -m venv /opt/sandbox-gateway \
 && /opt/sandbox-gateway/bin/pip install . \
 && /opt/sandbox-gateway/bin/pip uninstall --yes pip setuptools \
 && /opt/sandbox-gateway/bin/sandbox-gateway --help >/dev/null \
 && plane="$(/opt/sandbox-gateway/bin/python3 -I -c 'import gateway._compiled as c; print(c.DESCRIPTION)')" \
 && echo "data plane: $plane" \
 && if command -v gcc >/dev/null && [ "$plane" != "compiled (Cython)" ]; then \
      echo "a C compiler is here but the data plane did not compile (pip install -v . shows why)" >&2; \
      exit 1; fi

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/sandbox-gateway/bin:$PATH \
    SANDBOX_GATEWAY_DATA_DIR=/var/lib/sandbox-gateway
RUN groupadd --gid 10001 sandbox-gateway \
 && useradd --uid 10001 --gid 10001 --no-create-home \
      --home-dir /var/lib/sandbox-gateway --shell /usr/sbin/nologin sandbox-gateway \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/sandbox-gateway /etc/sandbox-gateway
# Same base image, same python3 path: the virtualenv's interpreter links stay valid.
COPY --from=builder /opt/sandbox-gateway /opt/sandbox-gateway
WORKDIR /var/lib/sandbox-gateway
USER 10001:10001
EXPOSE 8080 8081 50051
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s \
  CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8081/healthz', timeout=2)"]
ENTRYPOINT ["sandbox-gateway"]
CMD ["serve", "--host", "0.0.0.0"]
