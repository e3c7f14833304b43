#!/bin/sh
# Usage: expect_rc.sh RC COMMAND [ARGS...]
# Runs COMMAND (its output passes through) and ends with "[exit code N as expected]" when its exit code N is RC,
# else "[exit code N, expected RC]" and exit 1. gmod_cli_test (tests/CMakeLists.txt) appends the first marker to
# its PASS_REGULAR_EXPRESSION, because ctest ignores the exit code of a test that has one.
want=$1
shift
"$@"
rc=$?
if [ "$rc" -eq "$want" ]; then
  echo "[exit code $rc as expected]"
  exit 0
fi
echo "[exit code $rc, expected $want]"
exit 1
