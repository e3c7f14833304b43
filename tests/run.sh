#!/usr/bin/env bash
# The test command: set up the machine (cached), build everything, run every test (unit, mpirun, CLI).
set -euo pipefail
cd "$(dirname "$0")/.."
launch/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir build --output-on-failure -j "${GMOD_TEST_JOBS:-1}" "$@"
