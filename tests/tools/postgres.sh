#!/usr/bin/env bash
# A throwaway PostgreSQL for the tests: initdb into DIR, listening on a Unix socket in DIR and,
# for the TLS tests, on 127.0.0.1:PORT with TLS (a throwaway self-signed certificate), with
# pg_stat_statements loaded. PostgreSQL refuses to run as root: as root, it runs
# as the `postgres` user Debian's package makes. Stopped with pg_ctl, which signals the PID its
# postmaster.pid names (this server's, nobody else's).
#
#   postgres.sh start DIR PORT [SETTINGS]  prints the conninfo ("host=DIR port=PORT user=postgres
#                                ..."); the same over TLS is "host=127.0.0.1 port=PORT ...
#                                sslmode=require". SETTINGS: more server options ("-c
#                                max_connections=8"), after the defaults below
#   postgres.sh share DIR        the same on a free port, for every test of a ctest run (a
#                                fixture, tests/CMakeLists.txt): writes DIR/conninfo and DIR/port,
#                                or DIR/why (and exits 0) when PostgreSQL is not installed, for
#                                the tests to skip saying so (tests/testing/services.h)
#   postgres.sh stop DIR         stops it and removes DIR
#
# Exit 3 (and a line on stderr) when PostgreSQL is not installed.
set -euo pipefail
cmd=${1:?start|stop}
dir=${2:?DIR}
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
if [ "$cmd" = share ]; then
  "$0" stop "$dir" 2>/dev/null || true  # what an interrupted run left
  mkdir -p "$dir"
  port=$(python3 -c "import sys; sys.path.insert(0, '$(dirname "$0")/../../bench')
from ports import free_port; print(free_port())")
  if out=$("$0" start "$dir/server" "$port" 2>"$dir/why"); then
    rm -f "$dir/why"
    echo "$port" >"$dir/port"
    echo "$out" >"$dir/conninfo"
    exit 0
  fi
  status=$?
  cat "$dir/why" >&2
  [ $status -eq 3 ] && exit 0  # the tests skip, saying why
  exit $status
fi
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
    options+=" ${4:-}"
    "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start -o "$options" \
      >/dev/null || { cat "$dir/server.log" >&2; exit 1; }
    echo "host=$dir port=$port user=postgres dbname=postgres"
    ;;
  stop)
    for data in "$dir/data" "$dir/server/data"; do  # a server of start, or of share
      if [ -f "$data/postmaster.pid" ]; then
        "${as[@]}" "$bin/pg_ctl" -D "$data" -m fast -w -t 30 stop >/dev/null 2>&1 || true
      fi
    done
    rm -rf "$dir"
    ;;
  *)
    echo "postgres.sh: start or stop" >&2
    exit 2
    ;;
esac
