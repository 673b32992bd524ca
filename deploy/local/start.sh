#!/usr/bin/env bash
# Start PostgreSQL 15 and Redis on loopback, in a folder of their own, from Debian's packages
# (apt-get install postgresql redis-server). Nothing is installed or configured system-wide.
#
#   deploy/local/start.sh [DIR]     # default DIR: data/local-servers
#   . DIR/env                       # MEMORY_DAG_POSTGRES_URL, MEMORY_DAG_REDIS_URL, PG*, ...
#   deploy/local/stop.sh [DIR]
#
# Ports: PGPORT (default 54329) and REDIS_PORT (default 63799). PostgreSQL refuses to run as
# root, so as root the cluster is owned by the `postgres` user (runuser).
set -euo pipefail

DIR="$(realpath -m "${1:-data/local-servers}")"
PGPORT="${PGPORT:-54329}"
REDIS_PORT="${REDIS_PORT:-63799}"
PGBIN="${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}"

if [[ -z "$PGBIN" || ! -x "$PGBIN/initdb" ]]; then
  echo "start.sh: PostgreSQL binaries not found (apt-get install postgresql)" >&2
  exit 3
fi
if ! command -v redis-server >/dev/null; then
  echo "start.sh: redis-server not found (apt-get install redis-server)" >&2
  exit 3
fi

mkdir -p "$DIR"
as_owner=()
if [[ "$(id -u)" == 0 ]]; then
  as_owner=(runuser -u postgres --)
  mkdir -p "$DIR/pg"
  chown postgres "$DIR/pg"
  chmod o+x "$DIR"
fi

if [[ ! -f "$DIR/pg/data/PG_VERSION" ]]; then
  "${as_owner[@]}" "$PGBIN/initdb" -D "$DIR/pg/data" -U dagster --auth=trust -E UTF8 \
    --no-instructions >"$DIR/initdb.log"
fi
"${as_owner[@]}" "$PGBIN/pg_ctl" -D "$DIR/pg/data" -l "$DIR/pg/postgres.log" -w -t 60 \
  -o "-c listen_addresses=127.0.0.1 -c port=$PGPORT -c unix_socket_directories=$DIR/pg \
      -c max_connections=200 -c fsync=off" start >/dev/null
"$PGBIN/psql" -h 127.0.0.1 -p "$PGPORT" -U dagster -d postgres -tAc \
  "SELECT 1 FROM pg_database WHERE datname = 'dagster'" | grep -q 1 ||
  "$PGBIN/createdb" -h 127.0.0.1 -p "$PGPORT" -U dagster dagster

redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$DIR" --daemonize yes \
  --pidfile "$DIR/redis.pid" --logfile "$DIR/redis.log" --save "" --appendonly no
for _ in $(seq 50); do
  redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG && break
  sleep 0.1
done

cat >"$DIR/env" <<ENV
export PGHOST=127.0.0.1 PGPORT=$PGPORT PGUSER=dagster PGDATABASE=dagster
export MEMORY_DAG_POSTGRES_URL=postgresql+psycopg2://dagster@127.0.0.1:$PGPORT/dagster
export MEMORY_DAG_REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0
export MEMORY_DAG_SERVERS_DIR=$DIR
ENV
echo "PostgreSQL on 127.0.0.1:$PGPORT, Redis on 127.0.0.1:$REDIS_PORT; settings in $DIR/env"
