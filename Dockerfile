# The memory-dag code location as a container image, built from this repository's own files:
#   docker build -t memory-dag:latest .
# It serves the Dagster code location over gRPC (port 4000) for the webserver and daemon of
# Dagster's Helm chart (deploy/helm/values.yaml); the same image runs the Celery workers and the
# K8sRunLauncher's run pods. Shard stores live on the volume mounted at /data (docs/scale.md).
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    MEMORY_DAG_WORKSPACE=/data/workspace \
    MEMORY_DAG_DB=/data/memory.duckdb \
    DAGSTER_HOME=/opt/dagster/dagster_home

WORKDIR /opt/memory-dag
# Dependencies first (a layer that changes only with pyproject.toml), then the code.
COPY pyproject.toml README.md ./
COPY memory_dag ./memory_dag
RUN pip install '.[scale,k8s]' && pip uninstall -y memory-dag
COPY . .
RUN pip install --no-deps -e . \
    && mkdir -p "$DAGSTER_HOME" /data \
    && cp deploy/local/dagster.yaml "$DAGSTER_HOME/dagster.yaml"

# The Dagster layer (assets/, sensors/, schedules/) is imported from the checkout.
ENV PYTHONPATH=/opt/memory-dag:/opt/memory-dag/deploy/local
EXPOSE 4000
CMD ["dagster", "api", "grpc", "--host", "0.0.0.0", "--port", "4000", \
     "--module-name", "memory_dag.definitions", "--working-directory", "/opt/memory-dag"]
