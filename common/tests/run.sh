#!/usr/bin/env bash
# The test suite behind `make test`: CPU unit tests, bad options, the no-spill check, the
# plot/table/sweep tests, the labs, the format check, and, when a GPU is present, every stage's
# --self-test.
# Ends with one line "N passed, M failed, K skipped" summing every part, after one line per
# skipped check naming it and why.
#
# Each part prints "N passed, M failed" (optionally ", K skipped") last, or nothing and exits 0
# for one pass; each check it could not run here is a line "SKIP  what: why" (the binding's
# tests print "skipped  name: why", counted the same). A part's skips are counted from those
# lines, so the total names every one.
# usage: run.sh BUILD_DIR
set -u
dir=$1
cd "$(dirname "$0")/../.."
stages=$(ls -d stage[0-9]*/ 2>/dev/null | tr -d / | sort)
# the forward passes a stage links from another (its stage.mk's <stage>_FORWARD), built as
# obj/stage<n>_forward.o with their own ptxas report
forwards=$(for s in $stages; do grep -qs "^${s}_FORWARD *:\?=" "$s/stage.mk" && echo "${s%%_*}_forward"; done)
. common/exit_codes.sh || exit 1 # ATTN_EXIT_*: the programs' exit codes, from attention.h
passed=0 failed=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: >"$tmp/skips"

skip_re='^(SKIP|skipped) +'
skip() { # skip PART WHAT_AND_WHY: one skipped check, named in the closing list
  printf '%s: %s\n' "$1" "$2" >>"$tmp/skips"
}

part() { # part NAME COMMAND...: runs it, adds its "N passed, M failed" (or 1/0) to the total
  local name=$1; shift
  echo "== $name"
  "$@" >"$tmp/out" 2>&1
  local rc=$?
  cat "$tmp/out"
  local line; line=$(grep -oE '[0-9]+ passed, [0-9]+ failed' "$tmp/out" | tail -n 1)
  local nskip; nskip=$(grep -cE "$skip_re" "$tmp/out")
  grep -E "$skip_re" "$tmp/out" | sed -E "s/$skip_re//" | while IFS= read -r l; do skip "$name" "$l"; done
  if [ "$rc" -eq "$ATTN_EXIT_UNSUPPORTED" ] && grep -q "self-test waived" "$tmp/out"; then
    skip "$name" "waived: this stage does not run on this GPU"
  elif [ -n "$line" ]; then
    local p f
    p=$(awk '{print $1}' <<<"$line")
    f=$(awk '{print $3}' <<<"$line")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    passed=$((passed + p)) failed=$((failed + f))
  elif [ "$rc" -eq 0 ] && [ "$nskip" -gt 0 ]; then
    : # skipped as a whole: nothing passed
  elif [ "$rc" -eq 0 ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1)); echo "FAILED: $name (exit $rc)"
  fi
}

part "CPU unit tests" "$dir/test_common" "$tmp"
"$dir/test_common" --fixtures "$tmp" || failed=$((failed + 1))
for s in $stages; do part "$s: bad options" bash common/tests/bad_options.sh "$dir/$s" "$tmp"; done
part "make targets: no GPU, a mistyped ARCH, a missing tool, the formatter offline" bash common/tests/make_targets.sh
part "no spills, no stack frame, no ptxas performance warning (stages 1-7, every target built)" bash common/tests/check_spills.sh "$dir" $stages $forwards
part "the fat build's targets (sm_75 to sm_120), the README's list, the spill gate itself" bash common/tests/check_targets.sh "$dir"
if command -v python3 >/dev/null 2>&1; then
  part "one home each: the CSV header, the exit codes, the B x H limit, the variants list" python3 common/tests/one_home.py
else
  skip "one home each" "python3 not found (common/tests/one_home.py)"
fi
part "python binding: make lib, exports, tests" bash python/tests/run.sh "$dir"
if [ -f plots/tests/run.sh ]; then part "sweep, plots and tables" bash plots/tests/run.sh; fi
part "adding a stage: its folder and the ladder row only (a copy of stage 4, compute_75)" bash common/tests/add_stage.sh
part "lessons: code maps, line references, no untraced figure in prose" bash common/tests/check_lessons.sh
part "labs: generated from the markers, filled back byte for byte, make lab / make grade without a GPU" bash common/tests/check_labs.sh
part "C/CUDA sources formatted (pinned clang-format)" make --no-print-directory -s format-check
if nvidia-smi -L >/dev/null 2>&1; then
  for s in $stages; do part "$s --self-test" "$dir/$s" --self-test; done
else
  echo "== no GPU here: stage self-tests not run (make check runs them on a GPU)"
  for s in $stages; do skip "$s --self-test" "no NVIDIA GPU here (make check runs it on a GPU)"; done
fi
skipped=$(grep -c '' "$tmp/skips")
if [ "$skipped" -gt 0 ]; then
  echo "== skipped ($skipped), each with why:"
  sed 's/^/SKIPPED  /' "$tmp/skips"
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
