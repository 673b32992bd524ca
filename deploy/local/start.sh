#!/usr/bin/env bash
# Start PostgreSQL 15 (behind PgBouncer) and Redis on loopback, in a folder of their own, from
# Debian's packages (apt-get install postgresql pgbouncer redis-server). Nothing is installed or
# configured system-wide.
#
#   deploy/local/start.sh [DIR]     # default DIR: data/local-servers
#   . DIR/env                       # MEMORY_DAG_POSTGRES_URL, MEMORY_DAG_REDIS_URL, PG*, ...
#   deploy/local/stop.sh [DIR]
#
# Ports: PGPORT (default 54329), BOUNCER_PORT (default PGPORT + 1) and REDIS_PORT (default
# 63799). CODE_SERVER_PORT (default 4266) is only written to DIR/env: the code server that
# deploy/local/workspace.yaml names is started with the daemon, not by this script.
# PostgreSQL and PgBouncer refuse to run as root, so as root they run as the `postgres` user
# (runuser).
#
# Why PgBouncer: dagster-postgres opens a new connection for every statement (SQLAlchemy's
# NullPool, so an instance never holds connections), and each new PostgreSQL connection forks
# a backend: ~5 ms of server CPU. A deployment's daemon, workers and runs make dozens a second,
# and on a 2-core machine PostgreSQL used as much CPU as the runs themselves (docs/scale.md).
# PgBouncer (session pooling) keeps the server connections and hands them out; Dagster's URL
# (MEMORY_DAG_POSTGRES_URL) names PgBouncer, PG* name PostgreSQL itself (psql, maintenance).
# Without pgbouncer installed, the URL names PostgreSQL directly (and says so).
set -euo pipefail

DIR="$(realpath -m "${1:-data/local-servers}")"
PGPORT="${PGPORT:-54329}"
REDIS_PORT="${REDIS_PORT:-63799}"
CODE_SERVER_PORT="${CODE_SERVER_PORT:-4266}"
BOUNCER_PORT="${BOUNCER_PORT:-$((PGPORT + 1))}"
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

DAGSTER_PORT=$PGPORT
if command -v pgbouncer >/dev/null; then
  mkdir -p "$DIR/bouncer"
  echo '"dagster" ""' >"$DIR/bouncer/users.txt"
  cat >"$DIR/bouncer/pgbouncer.ini" <<INI
[databases]
dagster = host=127.0.0.1 port=$PGPORT dbname=dagster user=dagster

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $BOUNCER_PORT
unix_socket_dir =
auth_type = trust
auth_file = $DIR/bouncer/users.txt
; A client keeps its server connection while it is connected (what Dagster expects);
; Dagster's clients connect for one statement, so few server connections serve them all.
pool_mode = session
max_client_conn = 1000
default_pool_size = 40
; the webserver asks for a statement timeout through 'options'
ignore_startup_parameters = extra_float_digits,options
logfile = $DIR/bouncer/pgbouncer.log
pidfile = $DIR/bouncer/pgbouncer.pid
INI
  [[ "$(id -u)" == 0 ]] && chown -R postgres "$DIR/bouncer"
  "${as_owner[@]}" pgbouncer -d -q "$DIR/bouncer/pgbouncer.ini"
  bouncer_up=""
  for _ in $(seq 50); do
    "$PGBIN/psql" -h 127.0.0.1 -p "$BOUNCER_PORT" -U dagster -d dagster -tAc "SELECT 1" \
      >/dev/null 2>&1 && bouncer_up=1 && break
    sleep 0.1
  done
  if [[ -z "$bouncer_up" ]]; then
    echo "start.sh: PgBouncer does not answer on 127.0.0.1:$BOUNCER_PORT (port taken?);" \
      "see $DIR/bouncer/pgbouncer.log" >&2
    exit 4
  fi
  DAGSTER_PORT=$BOUNCER_PORT
else
  echo "start.sh: pgbouncer not found (apt-get install pgbouncer): Dagster connects to" \
    "PostgreSQL directly, a new server process for every statement" >&2
fi

redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$DIR" --daemonize yes \
  --pidfile "$DIR/redis.pid" --logfile "$DIR/redis.log" --save "" --appendonly no
redis_up=""
for _ in $(seq 50); do
  redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG && redis_up=1 && break
  sleep 0.1
done
if [[ -z "$redis_up" ]]; then
  echo "start.sh: Redis does not answer on 127.0.0.1:$REDIS_PORT (port taken?);" \
    "see $DIR/redis.log" >&2
  exit 4
fi

cat >"$DIR/env" <<ENV
export PGHOST=127.0.0.1 PGPORT=$PGPORT PGUSER=dagster PGDATABASE=dagster
export MEMORY_DAG_POSTGRES_URL=postgresql+psycopg2://dagster@127.0.0.1:$DAGSTER_PORT/dagster
export MEMORY_DAG_REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0
export MEMORY_DAG_SERVERS_DIR=$DIR
export MEMORY_DAG_CODE_SERVER_PORT=$CODE_SERVER_PORT
ENV
echo "PostgreSQL on 127.0.0.1:$PGPORT (Dagster's URL: port $DAGSTER_PORT), Redis on 127.0.0.1:$REDIS_PORT; settings in $DIR/env"
