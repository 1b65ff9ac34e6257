# syntax=docker/dockerfile:1
# One image for every chronowheel process: `node`, `worker`, `init`, `console` and the other CLI
# commands are arguments to the `chronowheel` entry point, e.g.
#   docker run --rm IMAGE node --namespace acme --kafka kafka:9092 --cassandra cassandra
# Traces are off unless OTEL_* variables ask (deploy/runbooks/kubernetes.md).
# Worker handlers are imported by module name: build an image FROM this one that adds them.
# tests/deploy/test_image.py lints this file (hadolint) and replays its pip install.

FROM python:3.11.11-slim-bookworm AS build
WORKDIR /src
COPY deploy/image/constraints.txt ./constraints.txt
COPY pyproject.toml README.md ./
COPY services ./services
RUN python -m venv /opt/chronowheel \
    && /opt/chronowheel/bin/pip install --no-cache-dir --constraint constraints.txt ".[otel]"

FROM python:3.11.11-slim-bookworm
RUN groupadd --system --gid 10001 chronowheel \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin chronowheel
COPY --from=build /opt/chronowheel /opt/chronowheel
# In a container the HTTP endpoint must listen beyond loopback for probes and scrapes.
ENV PATH=/opt/chronowheel/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    CHRONOWHEEL_HTTP_HOST=0.0.0.0
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["chronowheel"]
CMD ["--help"]
