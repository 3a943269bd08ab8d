#!/usr/bin/env bash
# Builds the libFuzzer drivers with clang and runs each for FUZZ_SECONDS (default 60), starting
# from its seed corpus (tests/fuzz/corpus/<name>, new finds go to build/fuzz/corpus/<name>).
# Prints libFuzzer's progress; fails if a driver finds a crash (the input is saved as
# build/fuzz/crash-*).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
CC=clang CXX=clang++ cmake -S tests/fuzz -B build/fuzz -G Ninja >/dev/null
ninja -C build/fuzz
for name in http1_parser chunked response_parser; do
  mkdir -p "build/fuzz/corpus/$name"
  echo "== fuzz $name for ${seconds}s =="
  "build/fuzz/${name}_fuzz" -max_total_time="$seconds" -print_final_stats=1 \
    -dict=tests/fuzz/http1.dict -artifact_prefix=build/fuzz/ \
    "build/fuzz/corpus/$name" "tests/fuzz/corpus/$name" 2>&1 |
    grep -E '^#[0-9]+.*(pulse|DONE|NEW)|stat::number_of_executed_units|ERROR|SUMMARY|Done' | tail -n 20
done
