#!/usr/bin/env bash
# The test command: set up the machine (cached), build everything, run every test (unit, mpirun, CLI) on
# GMOD_TEST_JOBS cores (default 2). The PyPI packages only the tests need (launch/setup.sh --tests: transformers,
# lmms-eval's venv, ...) install while the build compiles; on a fresh machine that hides most of the set-up. Each
# entry counts what it keeps busy in half-cores (cmake/TestScheduling.cmake), so ctest runs at twice the core count:
# a 2-rank mpirun entry runs alone on a 2-core machine, two ordinary entries share it, and the multi-node drills
# (which mostly wait) take half a core each.
set -euo pipefail
cd "$(dirname "$0")/.."
launch/setup.sh --build > /dev/null
mkdir -p build
launch/setup.sh --tests > build/setup-tests.log 2>&1 &
setup_pid=$!
if ! GMOD_SETUP=--build launch/build.sh; then
  wait "$setup_pid" || true
  exit 1
fi
if ! wait "$setup_pid"; then
  echo "tests/run.sh: launch/setup.sh --tests failed (build/setup-tests.log):" >&2
  tail -30 build/setup-tests.log >&2
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir build --output-on-failure -j "$((2 * ${GMOD_TEST_JOBS:-2}))" "$@"
