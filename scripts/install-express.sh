#!/usr/bin/env bash
# Installs the Express app's packages (tests/frameworks/express: express and cookie-parser, at
# the versions its package-lock.json pins, checked by their integrity hashes) from the npm
# registry into build/tools/express/, once. The framework tests start the app with them.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=build/tools/express
lock=tests/frameworks/express/package-lock.json
[ -f "$dest/node_modules/.package-lock.json" ] && cmp -s "$lock" "$dest/package-lock.json" && exit 0
command -v npm >/dev/null || { echo "install-express: npm is not installed (scripts/install-deps.sh test)" >&2; exit 1; }
mkdir -p "$dest"
cp tests/frameworks/express/package.json "$lock" "$dest/"
echo "install-express: installing express and cookie-parser into $dest"
(cd "$dest" && npm ci --no-audit --no-fund --loglevel=error)
