#!/usr/bin/env bash
# The test suite behind `make test`: CPU unit tests, bad options, the no-spill check, the
# plot/table/sweep tests, the labs, the format check, and, when a GPU is present, every stage's
# --self-test.
# Every suite reports through common/tests/report.sh: each check is one line of one record (the
# file $REPORT_FILE, set here and inherited by every suite, and by the suites they run); a program
# that is not a bash suite of that reporter (the C unit tests, the Python checks, make
# format-check) is read into the record by report_run from its "ok x" / "FAIL x" / "SKIP x: why"
# lines and its "N passed, M failed". The summary is computed from that record alone: every failure
# and every skip named, one line each, then "N passed, M failed, K skipped" last; exit 1 if any
# check failed.
# usage: run.sh BUILD_DIR
set -u
dir=$1
cd "$(dirname "$0")/../.."
# the stages of the one host program (stage 10's own program, NCCL's, is tested below)
stages=$(ls stage[0-9]*/attention.cu 2>/dev/null | cut -d/ -f1 | sort)
. common/exit_codes.sh || exit 1 # ATTN_EXIT_*: the programs' exit codes, from attention.h
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export REPORT_FILE=$tmp/record REPORT_SUITE=run.sh
: >"$REPORT_FILE"
. common/tests/report.sh

part() { # part NAME COMMAND...: one suite, its checks recorded (report.sh's report_run), timed
  local name=$1 t0=$SECONDS rc=0
  shift
  echo "== $name"
  REPORT_SUITE=$name report_run "$name" "$@" || rc=$?
  echo "-- $name: $((SECONDS - t0)) s"
  return $rc
}

self_test() { # self_test STAGE: its --self-test; a stage that does not run on this GPU waives it
  local out rc
  out=$("$dir/$1" --self-test 2>&1)
  rc=$?
  echo "$out"
  if [ "$rc" -eq "$ATTN_EXIT_UNSUPPORTED" ] && grep -q "self-test waived" <<<"$out"; then
    echo "SKIP  waived: this stage does not run on this GPU"
    return 0
  fi
  return "$rc"
}

part "CPU unit tests" "$dir/test_common" "$tmp"
part "CPU unit tests: the fixtures" "$dir/test_common" --fixtures "$tmp"
# The labs check (most of this suite's compiles, two at a time), the Python binding's tests (pip,
# venvs, a process each) and the sweep's (scripts over fake stages) run side by side with the
# parts after them, up to bg_join: each in the background with a record of its own (report_run
# counts a part's checks by the record's lines), its lines printed and its record joined to this
# one's when all have ended, in the order they were started. None writes where another reads: the
# labs build in their own folders, the binding links BUILD_DIR/lib (flags.txt as it is) and checks
# that python/ is left as it was, the other parts work in build folders and copies of their own.
bg_pids=()
bg_part() { # bg_part NAME COMMAND...: part NAME COMMAND... in the background
  local i=${#bg_pids[@]}
  (
    export REPORT_FILE=$tmp/bg$i.record
    : >"$REPORT_FILE"
    part "$@"
  ) >"$tmp/bg$i.out" 2>&1 &
  bg_pids+=($!)
}
bg_join() { # waits for every bg_part, then prints each one's lines and joins its record
  local i
  for i in "${!bg_pids[@]}"; do wait "${bg_pids[$i]}"; done
  for i in "${!bg_pids[@]}"; do
    cat "$tmp/bg$i.out"
    cat "$tmp/bg$i.record" >>"$REPORT_FILE"
  done
  bg_pids=()
}
bg_part "labs: generated from the markers, filled back byte for byte, make lab / make grade without a GPU" \
  bash common/tests/check_labs.sh
bg_part "python binding: make lib, exports, tests" bash python/tests/run.sh "$dir"
if [ -f plots/tests/run.sh ]; then bg_part "sweep, plots and tables" bash plots/tests/run.sh; fi
for s in $stages; do part "$s: bad options" bash common/tests/bad_options.sh "$dir/$s" "$tmp"; done
if [ -x "$dir/stage10_context_parallel" ]; then
  part "stage10_context_parallel: bad options, no GPU" bash common/tests/cp_options.sh "$dir/stage10_context_parallel"
else
  skip "stage10_context_parallel: not built (make says why: no NCCL here)"
fi
# fuzz.py's cases, each a run of a stage's program: with no GPU a program reads all its options,
# then exits 3 (no GPU here); a 2 would be an option or a combination the fuzzer made up
fuzz_options() {
  local out rc
  # shellcheck disable=SC2086
  out=$(python3 common/tests/fuzz.py "$dir" $stages --cases 25 --seed 1 2>&1)
  rc=$?
  if [ "$rc" -eq "$ATTN_EXIT_UNSUPPORTED" ] && grep -q '^0 passed, 0 failed, [1-9][0-9]* skipped$' <<<"$out" &&
    ! grep -q '^ *[0-9]* skipped: ' < <(grep -v 'no NVIDIA GPU here' <<<"$out"); then
    echo "ok    fuzz.py: $(tail -n 1 <<<"$out" | cut -d" " -f5) cases, each one's options read by its program (each exits $ATTN_EXIT_UNSUPPORTED, no GPU here)"
  else
    grep -v '^ *[0-9]* skipped: ' <<<"$out" | head -n 8
    echo "FAIL  fuzz.py (exit $rc): a case its program refused, or no case ran; each should exit $ATTN_EXIT_UNSUPPORTED (no GPU here)"
  fi
}
if ! command -v python3 >/dev/null 2>&1; then
  skip "fuzz.py's cases: python3 not found"
elif nvidia-smi -L >/dev/null 2>&1; then
  skip "fuzz.py's cases read with no GPU: a GPU is here (make fuzz runs them)"
else
  part "fuzz.py's random cases: every option read by the stage programs" fuzz_options
fi
part "make targets: no GPU, a mistyped ARCH, a missing tool, the formatter offline" bash common/tests/make_targets.sh
part "no spills, no stack frame, no ptxas performance warning (stages 1-7, every target built)" bash common/tests/check_spills.sh "$dir" $stages
# the stages built as sm_90a where the build has sm_90 (their stage.mk: wgmma, setmaxnreg)
hopper_stages=$(grep -l 'GENCODE *= *$(sm90a_gencode)' stage*/stage.mk 2>/dev/null | cut -d/ -f1 | sort)
part "no serialized wgmma (the sm_90a stages' machine code)" bash common/tests/check_wgmma.sh "$dir" $hopper_stages
part "the fat build's targets (sm_75 to sm_120), the README's list, the spill and wgmma gates themselves" bash common/tests/check_targets.sh "$dir"
if command -v python3 >/dev/null 2>&1; then
  part "one home each: the CSV header, the exit codes, the B x H limit, the variants list" python3 common/tests/one_home.py
else
  skip "one home each: python3 not found (common/tests/one_home.py)"
fi
part "adding a stage: its folder and the ladder row only (a copy of stage 4, compute_75)" bash common/tests/add_stage.sh
part "lessons: code maps, line references, no untraced figure in prose" bash common/tests/check_lessons.sh
part "exercise answers: every edit measure_answers.sh makes still applies to the source" bash common/tests/check_answer_edits.sh
bg_join
part "C/CUDA sources formatted (pinned clang-format)" make --no-print-directory -s format-check
if nvidia-smi -L >/dev/null 2>&1; then
  for s in $stages; do part "$s --self-test" self_test "$s"; done
else
  echo "== no GPU here: stage self-tests not run (make check runs them on a GPU)"
  for s in $stages; do skip "$s --self-test: no NVIDIA GPU here (make check runs it on a GPU)"; done
fi
# the summary, from the record alone: every failure, every skip, then the count
awk -F'\t' '$1 == "FAIL" { n++; f = f sprintf("FAILED   %s: %s\n", $2, $3) }
  $1 == "SKIP" { k++; s = s sprintf("SKIPPED  %s: %s\n", $2, $3) }
  END { if (n) printf "== failed (%d):\n%s", n, f; if (k) printf "== skipped (%d), each with why:\n%s", k, s }' "$REPORT_FILE"
report_end
