#!/usr/bin/env bash
# Configures and builds one configuration: release | debug | asan | tsan.
# Output goes to build/<config>/ (binaries in build/<config>/bin/).
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-release}
case "$config" in
  release) type=Release ;;
  debug) type=Debug ;;
  asan) type=Asan ;;
  tsan) type=Tsan ;;
  *) echo "build.sh: unknown configuration '$config' (release|debug|asan|tsan)" >&2; exit 2 ;;
esac
shift || true
dir=build/$config
bench=ON
[ "$config" = release ] || bench=OFF
# Configured once; again if the benchmarks were skipped (Google Benchmark was missing then:
# `make build` before `make bench` installed it) and it is there now.
benchmark_came() {
  [ "$bench" = ON ] && [ ! -d "$dir/bench" ] &&
    compgen -G "/usr/lib/*/cmake/benchmark/benchmarkConfig.cmake" >/dev/null
}
if [ ! -f "$dir/build.ninja" ] || benchmark_came; then
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE="$type" -DSPINDLE_BUILD_BENCH=$bench >/dev/null
fi
ninja -C "$dir" "$@"
