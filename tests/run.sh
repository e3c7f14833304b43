#!/usr/bin/env bash
# The test command: set up the machine (cached), build everything, run every test (unit, mpirun, CLI), two entries
# at a time by default (GMOD_TEST_JOBS): each entry counts the cores it keeps busy (cmake/TestScheduling.cmake), so a
# 2-rank mpirun entry runs alone on a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
launch/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir build --output-on-failure -j "${GMOD_TEST_JOBS:-2}" "$@"
