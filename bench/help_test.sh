#!/usr/bin/env bash
# Every bench program answers --help with its usage and exit code 0 (ctest bench_help). Usage:
#   bench/help_test.sh PYTHON BENCH_BINARY...      (the scripts under bench/ are found next to this file)
set -uo pipefail
py=$1
shift
here="$(cd "$(dirname "$0")" && pwd)"
fail=0
check() {  # NAME CMD...: rc 0 and a usage text
  local out rc
  out=$("${@:2}" --help 2>&1)
  rc=$?
  if [[ $rc -ne 0 || ! $out =~ [Uu]sage ]]; then
    echo "FAIL $1 --help: rc $rc"
    echo "$out" | head -5
    fail=1
  else
    echo "ok   $1 --help"
  fi
}
for b in "$@"; do check "$(basename "$b")" "$b"; done
for s in run_parallel.sh run_memory.sh kill_campaign.sh gpu_check.sh gpu_check_planted.sh; do check "$s" bash "$here/$s"; done
for p in bench_train.py bench_serve.py bench_checkpoint.py check_gpu_summary.py compare_transformers.py compare_llava_hr.py; do
  # compare_transformers imports transformers first: without it the script says so (exit 77), not its usage.
  if [[ $p == compare_transformers.py ]] && ! "$py" -c 'import transformers' 2>/dev/null; then
    echo "skip $p --help (no transformers)"
    continue
  fi
  check "$p" "$py" "$here/$p"
done
exit $fail
