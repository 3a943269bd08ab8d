#!/usr/bin/env bash
# A throwaway PostgreSQL for the tests: initdb into DIR, listening on a Unix socket in DIR only
# (no TCP), with pg_stat_statements loaded. PostgreSQL refuses to run as root: as root, it runs
# as the `postgres` user Debian's package makes. Stopped with pg_ctl, which signals the PID its
# postmaster.pid names (this server's, nobody else's).
#
#   postgres.sh start DIR PORT   prints the conninfo ("host=DIR port=PORT user=postgres ...")
#   postgres.sh stop DIR         stops it and removes DIR
#
# Exit 3 (and a line on stderr) when PostgreSQL is not installed.
set -euo pipefail
cmd=${1:?start|stop}
dir=${2:?DIR}
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$bin" ] || [ ! -x "$bin/postgres" ]; then
  echo "postgres.sh: PostgreSQL is not installed (apt-get install postgresql; make test does)" >&2
  exit 3
fi
as=()
if [ "$(id -u)" -eq 0 ]; then as=(setpriv --reuid=postgres --regid=postgres --init-groups --); fi
case $cmd in
  start)
    port=${3:?PORT}
    mkdir -p "$dir"
    if [ ${#as[@]} -gt 0 ]; then chown postgres:postgres "$dir"; fi
    chmod 700 "$dir"
    "${as[@]}" "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C -N \
      >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
    options="-k $dir -p $port -c listen_addresses='' -c fsync=off -c synchronous_commit=off"
    options+=" -c full_page_writes=off -c max_connections=600"
    options+=" -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all"
    "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start -o "$options" \
      >/dev/null || { cat "$dir/server.log" >&2; exit 1; }
    echo "host=$dir port=$port user=postgres dbname=postgres"
    ;;
  stop)
    if [ -f "$dir/data/postmaster.pid" ]; then
      "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -m fast -w -t 30 stop >/dev/null 2>&1 || true
    fi
    rm -rf "$dir"
    ;;
  *)
    echo "postgres.sh: start or stop" >&2
    exit 2
    ;;
esac
