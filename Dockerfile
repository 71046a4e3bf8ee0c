# One image for both roles: `worker` (the router, the default) and `serve` (the SSE gateway).
# Build: `make image` (docker or podman). The Kubernetes kit in deploy/kubernetes and compose.yaml
# run it as UID 10001 on a read-only root filesystem with /tmp as the only writable path.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder

# A build machine's own pip settings (a proxy's CA bundle, a local index), mounted at build time
# by `make image` with podman; this stage is discarded, so they never reach the image.
ARG PIP_CONFIG_FILE

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Every dependency ships binary wheels for this platform, so the builder needs no compiler.
RUN python -m venv /opt/eco-router

WORKDIR /src
# The dependencies first, from the lock with every file's hash (`make lock` writes it), so this
# layer is rebuilt only when the lock changes.
COPY requirements/run.lock ./requirements/
RUN /opt/eco-router/bin/pip install --no-cache-dir --require-hashes \
        --requirement requirements/run.lock
# setuptools reads README.md for the package's long description. The project brings no
# dependency of its own: the lock has them all.
COPY pyproject.toml README.md ./
COPY src ./src
# Byte-code is compiled here, at build time: the running container cannot write it.
RUN /opt/eco-router/bin/pip install --no-cache-dir --no-deps . \
    && /opt/eco-router/bin/python -m compileall -q /opt/eco-router


FROM ${PYTHON_IMAGE}

ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown

LABEL org.opencontainers.image.title="eco-router" \
      org.opencontainers.image.description="Event router for job-progress streaming: Redis Streams in, atomic per-job state, Pub/Sub out, SSE gateway." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"

# The root filesystem is read-only at run time: nothing may try to write byte-code or a home.
ENV PATH=/opt/eco-router/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp

# Numeric IDs so Kubernetes' runAsNonRoot can check them without reading /etc/passwd.
RUN groupadd --system --gid 10001 eco-router \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin eco-router

COPY --from=builder /opt/eco-router /opt/eco-router

WORKDIR /tmp
USER 10001:10001

# 8000: `serve` (SSE gateway, /health, /ready, /metrics); 8001: `worker`'s probes and metrics.
EXPOSE 8000 8001

ENTRYPOINT ["eco-router"]
CMD ["worker"]
