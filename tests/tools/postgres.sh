#!/usr/bin/env bash
# A throwaway PostgreSQL for the tests: initdb into DIR, listening on a Unix socket in DIR and,
# for the TLS tests, on 127.0.0.1:PORT with TLS (a throwaway self-signed certificate), with
# pg_stat_statements loaded. PostgreSQL refuses to run as root: as root, it runs
# as the `postgres` user Debian's package makes. Stopped with pg_ctl, which signals the PID its
# postmaster.pid names (this server's, nobody else's).
#
#   postgres.sh start DIR PORT   prints the conninfo ("host=DIR port=PORT user=postgres ..."); the
#                                same over TLS is "host=127.0.0.1 port=PORT ... sslmode=require"
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
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
      -subj /CN=localhost -keyout "$dir/data/server.key" -out "$dir/data/server.crt" 2>/dev/null
    chmod 600 "$dir/data/server.key"
    if [ ${#as[@]} -gt 0 ]; then chown postgres:postgres "$dir/data/server.key" "$dir/data/server.crt"; fi
    options="-k $dir -p $port -c listen_addresses=127.0.0.1 -c ssl=on"
    options+=" -c fsync=off -c synchronous_commit=off"
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
