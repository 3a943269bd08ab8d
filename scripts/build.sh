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
# ccache when it is installed and no launcher was chosen: a build tree made again (a new clone, a
# new worktree, rm -rf build) then compiles only what changed since any earlier build.
launcher=()
if command -v ccache >/dev/null && [ -z "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
if [ ! -f "$dir/build.ninja" ] || benchmark_came; then
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE="$type" -DSPINDLE_BUILD_BENCH=$bench \
    "${launcher[@]}" >/dev/null
fi
ninja -C "$dir" "$@"
