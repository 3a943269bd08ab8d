#!/usr/bin/env bash
# Builds the libFuzzer drivers with clang 19 and runs each for FUZZ_SECONDS (default 60),
# starting from its seed corpus (tests/fuzz/corpus/<name>; for the configuration loader, every
# YAML example of docs/*.md), new finds going to build/fuzz/corpus/<name>. Prints libFuzzer's
# progress; fails if a driver finds a crash (the input is saved as build/fuzz/crash-*).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
CC=clang-19 CXX=clang++-19 cmake -S tests/fuzz -B build/fuzz -G Ninja >/dev/null
ninja -C build/fuzz
scripts/config_examples.py build/fuzz/seed/config docs/*.md
status=0
for name in http1_parser chunked response_parser config jwt exchange pg_values hpack h2_frames h2_session \
  dns_reply; do
  mkdir -p "build/fuzz/corpus/$name"
  seed=tests/fuzz/corpus/$name
  dict=tests/fuzz/http1.dict
  if [ "$name" = config ]; then seed=build/fuzz/seed/config; dict=tests/fuzz/config.dict; fi
  if [ "$name" = jwt ]; then dict=tests/fuzz/jwt.dict; fi
  if [ "$name" = pg_values ]; then dict=tests/fuzz/pg.dict; fi
  echo "== fuzz $name for ${seconds}s =="
  set +e
  "build/fuzz/${name}_fuzz" -max_total_time="$seconds" -print_final_stats=1 -timeout=10 \
    -dict="$dict" -artifact_prefix=build/fuzz/ \
    "build/fuzz/corpus/$name" "$seed" 2>&1 |
    grep -E '^#[0-9]+.*(pulse|DONE)|stat::number_of_executed_units|ERROR|SUMMARY|Done|crash-' |
    tail -n 20
  code=${PIPESTATUS[0]}
  set -e
  if [ "$code" -ne 0 ]; then echo "fuzz: $name found a crash (exit $code)"; status=1; fi
done
exit $status
