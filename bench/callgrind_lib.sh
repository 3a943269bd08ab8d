# What the callgrind benchmarks share (sourced by bench/instructions.sh and
# bench/cache_misses.sh, after scripts/ports.sh, with $tmp their scratch folder): a server run
# under callgrind and loaded, and the nginx upstream their gateways proxy to.

# callgrind_run NAME PORT AMOUNT LOAD ARGV...: starts ARGV under callgrind (with the options in
# the array callgrind_options, if set), waits for PORT, runs `LOAD PORT AMOUNT` (the caller's
# function: it loads the server and prints how many requests were answered), has callgrind
# write its counts and stops the server by PID. Prints the requests, then each event's total
# over the whole run (start-up included; every output file, a server may start helpers) in
# callgrind's order: Ir first, then with --cache-sim=yes Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw.
callgrind_run() {
  local name=$1 port=$2 amount=$3 load=$4
  shift 4
  rm -f "$tmp/$name.out"*
  valgrind --tool=callgrind --callgrind-out-file="$tmp/$name.out" \
    ${callgrind_options[@]+"${callgrind_options[@]}"} "$@" >"$tmp/$name.log" 2>&1 &
  local pid=$!
  wait_port "$port" || { cat "$tmp/$name.log" >&2; exit 1; }
  local requests
  requests=$("$load" "$port" "$amount")
  callgrind_control -d "$pid" >/dev/null 2>&1
  sleep 1
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  cat "$tmp/$name.out"* | awk -v requests="$requests" '
    /^summary:/ { s = 1; for (i = 2; i <= NF; i++) sum[i - 1] += $i; n = NF - 1 }
    /^totals:/ { for (i = 2; i <= NF; i++) tot[i - 1] += $i; if (!n) n = NF - 1 }
    END { line = requests
      for (i = 1; i <= n; i++) line = line sprintf(" %.0f", s ? sum[i] : tot[i])
      print line }'
}

# start_nginx_upstream DIR: test certificates in DIR/certs, nginx's files under DIR; sets
# up_port (HTTP/1.1), up_h2_port (HTTP/2 over TLS) and nginx_pid. The caller stops nginx by that
# PID (in its EXIT trap) and waits for up_port before loading it.
start_nginx_upstream() {
  local dir=$1
  up_port=$(free_port)
  up_h2_port=$(free_port)
  mkdir -p "$dir/nginx"
  tests/tls/make-certs.sh "$dir/certs" >/dev/null 2>&1
  cat >"$dir/nginx.conf" <<CONF
daemon off; master_process off; worker_processes 1;
pid $dir/nginx/nginx.pid; error_log $dir/nginx/error.log crit; worker_rlimit_nofile 4096;
events { worker_connections 4096; }
http {
  access_log off; keepalive_requests 1000000; http2_max_requests 1000000; keepalive_timeout 300s;
  ssl_certificate $dir/certs/localhost.pem; ssl_certificate_key $dir/certs/localhost.key;
  client_body_temp_path $dir/nginx; proxy_temp_path $dir/nginx; fastcgi_temp_path $dir/nginx;
  uwsgi_temp_path $dir/nginx; scgi_temp_path $dir/nginx;
  server { listen 127.0.0.1:$up_port; listen 127.0.0.1:$up_h2_port ssl http2;
           location = /plaintext { default_type text/plain; return 200 "Hello, World!"; } }
}
CONF
  nginx -c "$dir/nginx.conf" -p "$dir/nginx" >/dev/null 2>&1 &
  nginx_pid=$!
}
