#!/usr/bin/env bash
# A binary whose shared libraries lie under /tmp (a torch venv made with GMOD_CACHE=/tmp/...) still starts on a
# node, whose own /tmp tmpfs would otherwise hide them: nodes.sh's mn_up shares those folders into every node.
# A one-line library and a program built here with the system C compiler stand in for LibTorch and gmod.
#   tests/multinode/test_tmp_libs.sh WORK_DIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
[[ $# -eq 1 ]] || { echo "usage: $0 WORK_DIR" >&2; exit 2; }
command -v cc > /dev/null || mn_skip "no C compiler (cc) to build the stand-in binary"
libdir=$(mktemp -d /tmp/gmod-mn-lib.XXXXXX) || { echo "FAIL: cannot make a folder under /tmp" >&2; exit 1; }
trap 'rm -rf "$libdir"' EXIT
bin=$1.standin
printf 'int mn_answer(void) { return 42; }\n' > "$libdir/l.c"
printf '#include <stdio.h>\nint mn_answer(void);\nint main(void) { printf("answer %%d\\n", mn_answer()); return 0; }\n' \
  > "$libdir/m.c"
if ! cc -shared -fPIC -o "$libdir/libmnanswer.so" "$libdir/l.c" ||
  ! cc -o "$bin" "$libdir/m.c" -L"$libdir" -lmnanswer -Wl,-rpath,"$libdir"; then
  echo "FAIL: cannot build the stand-in library and binary" >&2
  exit 1
fi
mn_init "$bin" "$1"
mn_up 1 "$MN_WORK" "$(dirname "$MN_BIN")"
trap 'mn_down; rm -rf "$libdir"' EXIT
out=$(mn_exec node1 "$MN_BIN" 2>&1)
[[ $out == "answer 42" ]] || mn_fail "the binary did not start on node1 with its library under /tmp: $out"
echo "PASS: a binary whose library lies under /tmp ($libdir) starts on a node (${SECONDS} s)"
