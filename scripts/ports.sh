# Loopback ports for the shell scripts that start servers (sourced: scripts/pgo.sh,
# bench/instructions.sh, bench/cache_misses.sh).

# A port free on 127.0.0.1 now (the kernel's choice).
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits up to 10 s for something to listen on 127.0.0.1:PORT; says so and fails otherwise.
wait_port() {
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on 127.0.0.1:$1 after 10 s" >&2
  return 1
}
