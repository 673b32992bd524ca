#!/usr/bin/env bash
# Stop the PostgreSQL, PgBouncer and Redis that deploy/local/start.sh started in DIR (their data stays).
set -uo pipefail

DIR="$(realpath -m "${1:-data/local-servers}")"
PGBIN="${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}"
as_owner=()
[[ "$(id -u)" == 0 ]] && as_owner=(runuser -u postgres --)

if [[ -f "$DIR/bouncer/pgbouncer.pid" ]]; then
  kill "$(cat "$DIR/bouncer/pgbouncer.pid")" 2>/dev/null
  for _ in $(seq 50); do [[ -f "$DIR/bouncer/pgbouncer.pid" ]] || break; sleep 0.1; done
fi
if [[ -f "$DIR/pg/data/postmaster.pid" ]]; then
  "${as_owner[@]}" "$PGBIN/pg_ctl" -D "$DIR/pg/data" -m fast -w stop >/dev/null
fi
if [[ -f "$DIR/redis.pid" ]]; then
  kill "$(cat "$DIR/redis.pid")" 2>/dev/null
  for _ in $(seq 50); do [[ -f "$DIR/redis.pid" ]] || break; sleep 0.1; done
fi
echo "stopped the servers in $DIR"
