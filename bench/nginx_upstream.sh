# The upstream that the callgrind benchmarks' gateways proxy to (sourced by
# bench/instructions.sh and bench/cache_misses.sh, after scripts/ports.sh): nginx, one worker,
# outside callgrind, answering /plaintext over HTTP/1.1 and over HTTP/2 with TLS.

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
