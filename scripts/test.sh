#!/usr/bin/env bash
# The one test command: installs dependencies, builds, and runs every test suite of the normal
# build (unit, integration, chaos, CLI, Python). Exits non-zero if anything fails.
#   scripts/test.sh --tsan   also runs the same C++ tests under ThreadSanitizer afterwards
#                            (scripts/tsan.sh: its own build in build-tsan/; any TSan report fails
#                            the run). GRANARY_TSAN=1 does the same.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
tsan=${GRANARY_TSAN:-0}
for arg in "$@"; do
  case "$arg" in
    --tsan) tsan=1 ;;
    *) echo "usage: scripts/test.sh [--tsan]" >&2; exit 2 ;;
  esac
done

bash scripts/install-deps.sh
bash scripts/build.sh

echo "== ctest (unit and integration) =="
# Allocators in the tests and every process they start check each free (OffsetAllocator::Free).
export GRANARY_CHECK_FREES=1
ctest --test-dir build --output-on-failure --timeout 300 -j 2
normal_done=$(date +%s)
echo "== normal suites passed in $(( normal_done - start ))s =="

if [[ "$tsan" == 1 ]]; then
  bash scripts/tsan.sh
  echo "== ThreadSanitizer suite passed in $(( $(date +%s) - normal_done ))s =="
fi

echo "== all suites passed in $(( $(date +%s) - start ))s =="
