#!/bin/sh
# Usage: help_test.sh GMOD
# `--help` of every command that `gmod help` lists (and of `gmod data check|demo`): exit code 0, its usage line,
# and each option the command takes (the table below) listed with a type or as a flag, and with a meaning.
# A command missing from the table fails the test, so a new command gets its options pinned here.
gmod=$1
fail=0
err() { echo "FAIL: $*" >&2; fail=1; }

# Options each command must list (flags marked with a trailing !).
options() {
  case $1 in
    completion) echo "" ;;
    answer) echo "--model --dtype --device --threads --routing --random-init --mod --tokenizer --template
                  --questions --images --answers --model-id --system --batch --max-new-tokens --top-p --temperature
                  --seed --num-chunks --chunk-idx --allow-problems! --format --single-pred-prompt! --stats" ;;
    arank) echo "--model --dtype --device --threads --routing --random-init --mod --tokenizer --template --max-len
                 --data --images --samples --batch --out --full-conversations!" ;;
    convert) echo "--model --out --rule --arank --skip-frac --router --forced --router-init --router-seed --dtype" ;;
    data) echo "" ;;
    "data check") echo "--images --tokenizer --template --max-len --image-tokens --image-token-id --truncation
                       --workers --no-image-first! --no-decode!" ;;
    "data demo") echo "--out --train --heldout --image-size --seed" ;;
    "data chat-template") echo "--template --system --no-image-first! --for-processor!" ;;
    eval) echo "--model --dtype --device --threads --routing --random-init --mod --tokenizer --template --max-len
                --data --images --batch --max-batches --json --no-exact-match!" ;;
    export) echo "--checkpoint --out --from-hf --template --pmod-original!" ;;
    forward) echo "--model --dtype --device --steps --batch --seq --threads --check-reference" ;;
    generate) echo "--model --dtype --device --threads --routing --random-init --mod --tokenizer --template
                    --prompt --image --system --max-new-tokens --top-p --temperature --seed --print-ids!" ;;
    info) echo "" ;;
    merge) echo "--model --adapter --out --dtype --template" ;;
    plan) echo "--world --gpu-mem --reserve-gb --checkpointing --checkpoint-every --model --images --mod-kept --set
                --json" ;;
    plot) echo "--metrics --out --gnuplot" ;;
    report) echo "--config --out --force! --gmod" ;;
    score) echo "--answers --annotations --questions --split --json --allow-problems! --show" ;;
    serve) echo "--model --dtype --device --threads --routing --random-init --mod --tokenizer --template --host --port
                 --max-batch --max-queue --max-new-tokens --api-key --name --max-image-pixels --max-images" ;;
    train) echo "--config --set --threads --dry-run!" ;;
    *) return 1 ;;
  esac
}

check() {  # check "COMMAND WORDS"
  # shellcheck disable=SC2086
  out=$("$gmod" $1 --help 2>&1)
  rc=$?
  [ "$rc" -eq 0 ] || err "gmod $1 --help: exit code $rc, expected 0: $out"
  echo "$out" | grep -q "^Usage: gmod $1 " || err "gmod $1 --help: no 'Usage: gmod $1' line: $out"
  echo "$out" | grep -q "Exit codes:" || err "gmod $1 --help: no exit codes"
  opts=$(options "$1") || { err "gmod help lists '$1', which this test does not know: add its options here"; return; }
  for o in $opts; do
    name=${o%!}
    line=$(echo "$out" | grep -E "^  $name( |$)") || { err "gmod $1 --help does not list $name"; continue; }
    if [ "$name" = "$o" ]; then  # takes a value: a type after the name, then a meaning (maybe on the next line)
      echo "$line" | grep -qE "^  $name [A-Za-z|=-]" || err "gmod $1 --help: $name has no type: $line"
      text=$(echo "$out" | grep -A1 -E "^  $name( |$)" | sed -E "s/^  $name [^ ]+//" | tr -d ' \n')
      [ -n "$text" ] || err "gmod $1 --help: $name has no meaning"
    else
      echo "$line" | grep -qE "^  $name +[a-z]" || err "gmod $1 --help: flag $name has no meaning: $line"
    fi
  done
  echo "ok: gmod $1 --help ($(echo "$opts" | wc -w) options)"
}

list=$("$gmod" help) || err "gmod help: exit code $?"
cmds=$(echo "$list" | sed -n '/^Subcommands:/,/^$/p' | awk 'NR > 1 && NF { print $1 }')
[ "$(echo "$cmds" | wc -w)" -ge 11 ] || err "gmod help lists only: $cmds"
for c in $cmds; do check "$c"; done
check "data check"
check "data demo"
check "data chat-template"
"$gmod" help train | grep -q "^Usage: gmod train " || err "gmod help train does not print train's help"
"$gmod" --version | grep -qE "^gmod [0-9]+\.[0-9]+\.[0-9]+ \(LibTorch [0-9]" || err "gmod --version: $("$gmod" --version)"
"$gmod" >/dev/null 2>&1
[ $? -eq 2 ] || err "gmod without a command: exit code is not 2"
[ $fail -eq 0 ] && echo "every command's --help lists its options"
exit $fail
