#!/usr/bin/env bash
# Stage 10's program (build/stage10_context_parallel, common/ring_main.c) on bad input: each bad
# option gives exit 2 and one line on stderr naming it (checked before any GPU is touched); on a
# machine without a GPU a good command line gives exit 3 and one line ("waived").
# One line per failed check and "N passed, M failed, K skipped" last (common/tests/report.sh).
# usage: cp_options.sh BINARY
set -u
bin=$1
. "$(dirname "$0")/report.sh"
. "$(dirname "$0")/../exit_codes.sh" || exit 1
expect() { # expect CODE PATTERN ARGS...
  local want=$1 pat=$2; shift 2
  local err rc lines
  err=$("$bin" "$@" 2>&1 >/dev/null); rc=$?
  lines=$(printf '%s' "$err" | grep -c '' || true)
  if [ "$rc" -eq "$want" ] && { [ "$want" -eq 0 ] || [ "$lines" -eq 1 ]; } && { [ -z "$pat" ] || printf '%s' "$err" | grep -qiF -- "$pat"; }; then
    ok "$(basename "$bin") $* -> exit $rc"
  else
    bad "$(basename "$bin") $* -> exit $rc (want $want), stderr: $err"
  fi
}
U=$ATTN_EXIT_USAGE
expect "$U" "unknown option '--frobnicate'" --frobnicate
expect "$U" "--seq: '0'" --seq 0
expect "$U" "--seq: 'x'" --seq x
expect "$U" "--seq needs a value" --seq
expect "$U" "--gpus: '0'" --gpus 0
expect "$U" "--dim: 100 is not a multiple of 8" --dim 100
expect "$U" "--dim: '16'" --dim 16
expect "$U" "--kv-heads: 3 does not divide --heads 8" --heads 8 --kv-heads 3
expect "$U" "--layout: 'spiral'" --layout spiral
expect "$U" "--dist: 'flat'" --dist flat
expect "$U" "--budget: '-1'" --budget -1
expect "$U" "--check: 'some'" --check some
expect "$U" "--against: 'cpu'" --against cpu
expect "$U" "--repeats: '0'" --repeats 0
expect "$U" "--piece: '0'" --piece 0
expect "$ATTN_EXIT_PASS" "" --help
if nvidia-smi -L >/dev/null 2>&1; then
  skip "$(basename "$bin") without a GPU: exit 3 (there is a GPU here)"
else
  expect "$ATTN_EXIT_UNSUPPORTED" "no NVIDIA GPU here" --seq 1024 --causal
fi
report_end
