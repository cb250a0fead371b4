#!/usr/bin/env bash
# The one test command: installs dependencies, builds, and runs every test suite.
# Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

bash scripts/install-deps.sh
bash scripts/build.sh

echo "== ctest (unit and integration) =="
ctest --test-dir build --output-on-failure --timeout 300 -j 2

echo "== all suites passed in $(( $(date +%s) - start ))s =="
