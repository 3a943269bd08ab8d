#!/usr/bin/env bash
# make goals: issue 24's goals measured with enough rounds for a verdict, and charted. Each
# comparison takes turns with its peers round by round (one worker each); the verdict needs the
# interval of the paired ratios' median, and ten rounds gave intervals wide enough to read a
# lucky median as a met goal (docs/performance.md, "How to measure").
#   bench/goals.sh [ROUNDS]   (default 30; the c500 proxy set-ups a third of them; ~45 min)
# Writes bench/results/goals-{tls,proxy-c100,proxy-c500,proxy,http}-COMMIT.json, and replaces
# the chart docs/benchmarks-goals.png and the `make goals` section of docs/benchmarks.md (the
# commit is in the section, not in the chart's name). Loopback only; every process it starts
# it stops, by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-30}
py=/usr/bin/python3  # Debian's python3, which has python3-matplotlib
out=bench/results
commit=$(git rev-parse --short HEAD)
mkdir -p "$out"
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt 20000 ]; then
  ulimit -n 20000 2>/dev/null || {
    echo "goals.sh: needs 20000 open files (ulimit -n is $(ulimit -n), hard limit $(ulimit -Hn))" >&2
    exit 1
  }
fi

echo "[goals 1/4] h2c and h2 over TLS against h2o, $rounds rounds"
"$py" bench/tls_compare.py --servers spindle,h2o --workloads "h2 TLS c100 m10,h2c c100 m10" \
  --rounds "$rounds" --seconds 4 --out "$out/goals-tls-$commit.json"
echo "[goals 2/4] proxy h2(TLS) -> h1 and -> h2 at c100 against h2o and haproxy, $rounds rounds"
"$py" bench/proxy_compare.py --gateways spindle,h2o,haproxy --setups "h2tls->h1,h2tls->h2" \
  --connections 100 --rounds "$rounds" --seconds 4 --out "$out/goals-proxy-c100-$commit.json"
echo "[goals 3/4] HTTP/1.1 keep-alive against the C ceiling, $rounds rounds"
"$py" bench/http_compare.py --workers 1 --servers spindle,ceiling --workloads "keep-alive c100" \
  --rounds "$rounds" --seconds 4 --out "$out/goals-http-$commit.json"
c500_rounds=$(((rounds + 2) / 3))
echo "[goals 4/4] the proxy set-ups at c500, $c500_rounds rounds"
"$py" bench/proxy_compare.py --gateways spindle,h2o,haproxy --setups "h2tls->h1,h2tls->h2" \
  --connections 500 --rounds "$c500_rounds" --seconds 4 --out "$out/goals-proxy-c500-$commit.json"

# One proxy file for the chart: both connection counts.
"$py" - "$out/goals-proxy-c100-$commit.json" "$out/goals-proxy-c500-$commit.json" \
  "$out/goals-proxy-$commit.json" <<'PY'
import json, sys
c100, c500 = (json.load(open(f)) for f in sys.argv[1:3])
c100["results"] += c500["results"]
c100["rounds"] = f"{c100['rounds']} (c100), {c500['rounds']} (c500)"
json.dump(c100, open(sys.argv[3], "w"), indent=1)
PY
"$py" bench/goals_chart.py --tls "$out/goals-tls-$commit.json" --proxy "$out/goals-proxy-$commit.json" \
  --http "$out/goals-http-$commit.json" --out docs/benchmarks-goals.png \
  --title "issue 24's goals at $commit, $rounds rounds (c500: $c500_rounds)" \
  --markdown docs/benchmarks.md --command "bench/goals.sh $rounds"
