#!/bin/bash
# Usage: completion_test.sh GMOD
# `gmod completion bash` loads in bash and completes commands, nested commands and options.
gmod=$1
fail=0
# shellcheck disable=SC1090
source <("$gmod" completion bash) || { echo "FAIL: the script does not load"; exit 1; }
expect() {  # expect "WANT" WORDS...: completing the last word of WORDS offers exactly WANT
  local want=$1
  shift
  COMP_WORDS=("$@")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMPREPLY=()
  _gmod
  local got="${COMPREPLY[*]}"
  if [ "$got" = "$want" ]; then echo "ok: ${COMP_WORDS[*]} -> $got"; else echo "FAIL: ${COMP_WORDS[*]} -> '$got', expected '$want'"; fail=1; fi
}
expect "eval export" gmod e
expect "--model --mod" gmod eval --mo
expect "check chat-template" gmod data ch
expect "check" gmod data che
expect "--no-image-first --no-decode" gmod data check --no
expect "--dry-run" gmod train --d
expect "--check-reference" gmod forward --ch
expect "train" gmod help tr
expect "" gmod train --config conf  # a value: left to bash's file-name completion
exit $fail
