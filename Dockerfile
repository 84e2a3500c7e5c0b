# cardquota: the admission webhook server. Multi-stage: the build stage makes the wheel and a virtual
# environment with the pinned dependencies; the final stage copies only that environment (no pip,
# no compilers) and runs as a non-root user. Build with `make image` (any OCI builder).
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
WORKDIR /src
COPY pyproject.toml README.md requirements.lock ./
COPY webhook ./webhook
RUN python3 -m venv /opt/cardquota \
 && /opt/cardquota/bin/pip install --no-cache-dir --upgrade pip \
 && /opt/cardquota/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && /opt/cardquota/bin/pip install --no-cache-dir --only-binary=:all: -r requirements.lock \
 && /opt/cardquota/bin/pip install --no-cache-dir --no-deps /wheels/*.whl \
 && /opt/cardquota/bin/pip uninstall --yes pip \
 && find /opt/cardquota -name __pycache__ -prune -exec rm -rf {} +

FROM ${BASE}
COPY --from=build /opt/cardquota /opt/cardquota
ENV PATH=/opt/cardquota/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A numeric user, so runAsNonRoot can verify it; the root filesystem can be read-only: the server
# writes nothing but its log lines to stdout.
USER 65532:65532
WORKDIR /
EXPOSE 8443
ENTRYPOINT ["cardquota"]
CMD ["serve", "--cert-dir", "/etc/cardquota/tls"]
