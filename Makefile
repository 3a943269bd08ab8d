# The user-facing verbs. Each installs missing Debian packages first (scripts/install-deps.sh).
#
#   make run     build and start spindle on 127.0.0.1:8080 (embedded default configuration)
#   make check   the fast loop: format check, release build, ctest and pytest side by side (pytest
#                over worker processes); not the sanitizer builds nor the tests marked exclusive
#   make test    format check, then the whole suite in release, asan (ASan+UBSan) and tsan
#   make build   release build: build/release/bin/
#   make bench   micro-benchmarks and the echo throughput comparison, written to docs/
#   make goals   issue 24's goals against h2o, haproxy and the C ceiling, 30 rounds (~45 min)
#   make soak    10,000 connections through the proxy for 3 minutes, HTTP/1.1 then HTTP/2 over
#                TLS both ways: errors, RSS, descriptors
#   make fuzz    libFuzzer drivers (HTTP/1, chunked, responses, configuration, JWT, exchange,
#                PostgreSQL values, HPACK, HTTP/2 frames and sessions, DNS replies;
#                FUZZ_SECONDS each)
#   make format  reformat every source file with clang-format
#   make package the Debian package build/spindle_<version>_amd64.deb (lintian-checked; PGO=1:
#                from the profile-guided build)
#   make pgo     spindle built from a profile of its own load: build/pgo/bin/ (scripts/pgo.sh)
#   make install cmake --install build/release (PREFIX=/usr/local): headers, libraries, CMake package

SHELL := /bin/bash
JOBS ?= $(shell nproc)

.PHONY: run check test build bench goals soak fuzz format format-check deps deps-test deps-bench debug asan tsan package install pgo

deps:
	@scripts/install-deps.sh build
deps-test:
	@scripts/install-deps.sh test
deps-bench:
	@scripts/install-deps.sh bench

build: deps
	@scripts/build.sh release

debug: deps
	@scripts/build.sh debug

package: deps-test $(if $(filter 1,$(PGO)),deps-bench)
	@scripts/package.sh

PREFIX ?= /usr/local
install: build
	cmake --install build/release --prefix $(PREFIX)

run: build
	build/release/bin/spindle serve

check: deps-test
	@scripts/check.sh

test: deps-test
	@scripts/run-tests.sh

pgo: deps-bench
	@scripts/pgo.sh

bench: deps-bench
	@scripts/build.sh release
	@bench/run.sh

goals: deps-bench
	@scripts/build.sh release
	@bench/goals.sh

format: deps-test
	@git ls-files '*.h' '*.cc' | xargs clang-format -i

format-check: deps-test
	@scripts/check-format.sh

soak: deps-bench
	@scripts/build.sh release
	@/usr/bin/python3 bench/soak_proxy.py --seconds 180 --out bench/results/soak.json \
	  --chart docs/benchmarks-soak.png --markdown docs/benchmarks.md
	@/usr/bin/python3 bench/soak_proxy.py --protocol h2 --streams 2 --seconds 180 \
	  --out bench/results/soak-h2.json --chart docs/benchmarks-soak-h2.png \
	  --markdown docs/benchmarks.md

fuzz: deps-test
	@scripts/fuzz.sh
