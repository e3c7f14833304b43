#!/bin/sh
# Nothing outside mod/ names a MoD method (issue 44): a method's layer behaviour, capacity, checks, CLI flags and
# config keys live behind mod/token_selection.h and come from its registration (mod/method_registry.h). Greps the
# code (comments stripped) of trainer/, launch/, model/, serve/, eval/ and parallel/ for RouterKind, its
# enumerators and the methods' names. Fails listing every offending line that is not in
# tests/mod/method_names_allowed.txt (the sites not moved yet), and every allowed line that is gone (so the list
# only shrinks). "γ-MoD" alone is the framework's model format, not a method choice, and is not matched.
# Usage: method_names_test.sh REPO_ROOT
set -eu
root=$1
cd "$root"
allow=tests/mod/method_names_allowed.txt
# Identifiers in any case (pmod, PMoD, FastV, ...); the display names as written ("gamma-mod" is not "A-MoD").
pat='RouterKind|\bk(GammaShared|PerLayer|Attention|FastV|PMoD|PDrop)\b|[Pp][Mm][Oo][Dd]|[Pp][Dd][Rr][Oo][Pp]|[Ff][Aa][Ss][Tt][Vv]|(^|[^A-Za-z])[Aa][Mm][Oo][Dd]|gamma_shared|p-MoD|PyramidDrop|A-MoD'
found=$(mktemp)
allowed=$(mktemp)
trap 'rm -f "$found" "$allowed"' EXIT
for f in $(find trainer launch model serve eval parallel \( -name '*.cpp' -o -name '*.h' \) | LC_ALL=C sort); do
  # "path:line<TAB>path: code" per matching line, the code without its comment and outer blanks.
  sed 's|//.*||' "$f" | grep -nE "$pat" |
    sed -e 's/^\([0-9]*\):[[:space:]]*/\1\t/' -e 's/[[:space:]]*$//' |
    awk -F '\t' -v f="$f" '{ print f ":" $1 "\t" f ": " $2 }' >>"$found" || true
done
grep -v '^#' "$allow" | grep -v '^$' | LC_ALL=C sort -u >"$allowed" || true
rc=0
new=$(awk -F '\t' 'FILENAME == ARGV[1] { ok[$0] = 1; next } !($2 in ok) { print "  " $1 ": " substr($2, index($2, ": ") + 2) }' \
  "$allowed" "$found")
if [ -n "$new" ]; then
  echo "lines outside mod/ that name a MoD method (move them behind mod/token_selection.h / mod/method_registry.h):"
  echo "$new"
  rc=1
fi
stale=$(awk -F '\t' 'FILENAME == ARGV[1] { seen[$2] = 1; next } !($0 in seen) { print "  " $0 }' "$found" "$allowed")
if [ -n "$stale" ]; then
  echo "lines in $allow that no longer occur (remove them from the list):"
  echo "$stale"
  rc=1
fi
[ "$rc" -eq 0 ] && echo "no method names outside mod/ beyond the $(wc -l <"$allowed") listed in $allow"
exit "$rc"
