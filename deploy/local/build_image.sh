#!/usr/bin/env bash
# Build the code location's image from the repository's Dockerfile without a Docker daemon
# (buildah, chroot isolation), then check it: the code server answers a gRPC health check and
# the whole ingest graph runs inside it on the sample workspace.
#
#   deploy/local/build_image.sh [--standin-base]      # apt-get install buildah [debootstrap]
#
# --standin-base: where the registry's python:3.11-slim-bookworm cannot be pulled (a sandbox
# that reaches only package registries), make a stand-in of it first: Debian bookworm from
# Debian's mirror with python3 3.11, pip and venv (debootstrap), tagged with the base's name.
# The host's pip configuration and CA bundle are lent to the build's RUN steps when present,
# so `pip install` reaches the same package index the host does.
set -euo pipefail
cd "$(dirname "$0")/../.."
STORE=(--storage-driver vfs)
BASE=docker.io/library/python:3.11-slim-bookworm
WORK=$(mktemp -d)
DAGSTER=$(command -v dagster || echo "$PWD/.venv/bin/dagster")  # the host's, for the health check
trap 'rm -rf "$WORK"' EXIT

if [[ "${1:-}" == "--standin-base" ]] && ! buildah "${STORE[@]}" inspect "$BASE" >/dev/null 2>&1; then
  debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    bookworm "$WORK/rootfs" http://deb.debian.org/debian >"$WORK/debootstrap.log"
  rm -f "$WORK"/rootfs/usr/lib/python3.*/EXTERNALLY-MANAGED  # pip installs system-wide, as in the base
  ln -sf python3 "$WORK/rootfs/usr/bin/python"
  tar -C "$WORK/rootfs" -c . | podman "${STORE[@]}" import - "$BASE" >/dev/null
fi

LEND=()
for path in /etc/ssl/certs/ca-certificates.crt /etc/pip.conf /etc/xdg/pip /opt/wheels /opt/pypi /opt/pypi-more; do
  [[ -e "$path" ]] && LEND+=(-v "$path:$path:ro")
done
git clone -q . "$WORK/context"  # the committed files, as CI's clean clone has them
buildah "${STORE[@]}" bud --isolation chroot --pull-never --network host "${LEND[@]}" \
  -t memory-dag:latest "$WORK/context"

CONTAINER=$(buildah "${STORE[@]}" from --pull-never localhost/memory-dag:latest)
trap 'buildah "${STORE[@]}" rm "$CONTAINER" >/dev/null; rm -rf "$WORK"' EXIT
PORT=4000
buildah "${STORE[@]}" run --isolation chroot --network host "$CONTAINER" -- \
  dagster api grpc --host 127.0.0.1 --port "$PORT" --module-name memory_dag.definitions \
  --working-directory /opt/memory-dag >"$WORK/grpc.log" 2>&1 &
SERVER=$!
for _ in $(seq 120); do
  if "$DAGSTER" api grpc-health-check --port "$PORT" >/dev/null 2>&1; then break; fi
  sleep 1
done
"$DAGSTER" api grpc-health-check --port "$PORT"
pkill -f "dagster api grpc --host 127.0.0.1 --port $PORT" || true
wait "$SERVER" || true

buildah "${STORE[@]}" run --isolation chroot --network host "$CONTAINER" -- sh -c '
  export DAGSTER_HOME=$(mktemp -d) && cd /opt/memory-dag &&
  memory-dag ingest --workspace data/workspace --db /tmp/demo/memory.duckdb --index-dir /tmp/demo/index &&
  memory-dag search "what does the user like?" --workspace data/workspace \
    --db /tmp/demo/memory.duckdb --index-dir /tmp/demo/index --limit 3'
echo "image memory-dag:latest built and checked"
