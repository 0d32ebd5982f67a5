#!/usr/bin/env bash
# Adding a stage takes its folder and the README's ladder row, nothing else: in a temporary copy
# of the repository (its tracked and untracked files), stage 4's folder is copied under a new
# stage number and name, its names changed to the new one, a ladder row added; then the copy
# builds that stage's program and library (PTX for compute_75 only: cheap) and runs the CPU
# checks that read every stage: its bad options, its lesson's code map, `make diff`, `make help`.
# One line per check and "N passed, M failed, K skipped" last (common/tests/report.sh).
# usage: add_stage.sh
set -u
cd "$(dirname "$0")/../.."
. common/tests/report.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; report_cleanup' EXIT
repo=$tmp/repo
mkdir -p "$repo"
git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$repo" 2>/dev/null
from=stage4_wmma
last=$(ls -d stage[0-9]*/ | tr -d / | sed 's/^stage\([0-9]*\)_.*/\1/' | sort -n | tail -n 1)
n=$((last + 1))
new=stage${n}_added
cp -r "$repo/$from" "$repo/$new"
grep -rl "$from" "$repo/$new" | xargs sed -i "s/$from/$new/g" # its names; its stage.mk's too
row=$(grep -n "^| 4 wmma |" "$repo/README.md" | cut -d: -f1)
[ -n "$row" ] && sed -i "${row}a | $n added | stage 4, copied | fp16 | [$new]($new/README.md) |" "$repo/README.md"
build=$tmp/build
if make -C "$repo" --no-print-directory -s ARCH=compute_75 BUILD="$build" "$build/$new" "$build/lib/lib$new.so" \
    "$build/test_common" >"$tmp/build.log" 2>&1; then
  ok "the new stage $new builds (program and library, compute_75) from its folder alone"
else
  tail -n 20 "$tmp/build.log"; bad "the new stage $new does not build"
  report_end; exit 1
fi
mkdir -p "$tmp/fx" && "$build/test_common" --fixtures "$tmp/fx" >/dev/null 2>&1
# the new stage's bad options: their checks are this one check's evidence, not checks of make test
out=$(env -u REPORT_FILE bash common/tests/bad_options.sh "$build/$new" "$tmp/fx" 2>&1)
if tail -n 1 <<<"$out" | grep -qE '^[0-9]+ passed, 0 failed, '; then ok "$new: bad options"; else
  tail -n 5 <<<"$out"; bad "$new: bad options"; fi
if "$build/$new" --help | grep -q "^$new: "; then ok "$new --help names it"; else bad "$new --help"; fi
if python3 common/tests/check_lessons.py --root "$repo" "$repo/$new/README.md" >"$tmp/lessons" 2>&1; then
  ok "$new: its lesson's code map"; else tail -n 5 "$tmp/lessons"; bad "$new: its lesson's code map"; fi
# make diff: the stage against the one before (a copy of stage 4 after stage 9's decode is a
# rewrite: one line naming it, its files by role); ALL=1 the whole diff either way
make -C "$repo" --no-print-directory -s diff STAGE=$n >"$tmp/diff" 2>&1 </dev/null
make -C "$repo" --no-print-directory -s diff STAGE=$n ALL=1 >"$tmp/diff_all" 2>&1 </dev/null
if { grep -q "^diff --git .* $new\$" "$tmp/diff" || grep -q "^make diff: $new rewrites " "$tmp/diff"; } &&
  grep -q "^diff --git .* $new\$" "$tmp/diff_all"; then
  ok "make diff STAGE=$n"; else head -n 3 "$tmp/diff"; bad "make diff STAGE=$n"; fi
if make -C "$repo" --no-print-directory -s help | grep -q "$new"; then ok "make help lists $new"; else bad "make help"; fi
report_end
