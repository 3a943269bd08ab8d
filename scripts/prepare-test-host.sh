#!/usr/bin/env bash
# Host settings the suite needs, raised only when lower than needed and only if allowed.
# Prints what it changed; never fails (the tests that need a setting explain a skip).
set -u
need_maps=262144  # 100k fibers, each a stack mapping plus a guard mapping
maps=$(cat /proc/sys/vm/max_map_count 2>/dev/null || echo 0)
if [ "$maps" -lt "$need_maps" ]; then
  if echo "$need_maps" > /proc/sys/vm/max_map_count 2>/dev/null; then
    echo "prepare-test-host: vm.max_map_count $maps -> $need_maps (guarded fiber stacks)"
  else
    echo "prepare-test-host: vm.max_map_count is $maps and cannot be raised here; the 100k-fiber test will skip"
  fi
fi
