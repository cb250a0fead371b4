#!/usr/bin/env bash
# Configures and builds Granary into build/ (or $GRANARY_BUILD_DIR) with Ninja, -j2.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${GRANARY_BUILD_DIR:-build}
BUILD_TYPE=${GRANARY_BUILD_TYPE:-RelWithDebInfo}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE" "$@" >/dev/null
ninja -C "$BUILD_DIR" -j "${GRANARY_JOBS:-2}"
