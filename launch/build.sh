#!/usr/bin/env bash
# Configures and builds gmod into ./build (after launch/setup.sh). Extra arguments go to cmake --build.
# GMOD_SETUP=--build sets up only what the build needs (tests/run.sh sets up the rest beside the build).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="$(launch/setup.sh ${GMOD_SETUP:-} | tail -1)"
export CCACHE_NOHASHDIR=1 CCACHE_BASEDIR="$PWD" CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/gmod/ccache}" CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
JOBS="${GMOD_JOBS:-$(nproc)}"
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DGMOD_PYTHON="$VENV/bin/python" ${GMOD_CMAKE_ARGS:-} >/dev/null
fi
cmake --build build -j "$JOBS" "$@"
