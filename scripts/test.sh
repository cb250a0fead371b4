#!/usr/bin/env bash
# The one test command: installs dependencies, builds, and runs every test suite: the normal
# build's (unit, integration, CLI, Python) and then the same C++ tests under ThreadSanitizer
# (scripts/tsan.sh: its own build in build-tsan/; any TSan report fails the run).
# Exits non-zero if anything fails. GRANARY_SKIP_TSAN=1 skips the TSan part (a local shortcut;
# CI runs everything).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

bash scripts/install-deps.sh
bash scripts/build.sh

echo "== ctest (unit and integration) =="
ctest --test-dir build --output-on-failure --timeout 300 -j 2
normal_done=$(date +%s)
echo "== normal suites passed in $(( normal_done - start ))s =="

if [[ "${GRANARY_SKIP_TSAN:-0}" == 1 ]]; then
  echo "== ThreadSanitizer suite skipped (GRANARY_SKIP_TSAN=1) =="
else
  bash scripts/tsan.sh
  echo "== ThreadSanitizer suite passed in $(( $(date +%s) - normal_done ))s =="
fi

echo "== all suites passed in $(( $(date +%s) - start ))s =="
