#!/usr/bin/env bash
# Fails if any kernel of stages 1-7 spills or has a stack frame on any target compiled, or if
# ptxas reports a "Potential Performance Loss" (for stage 6: wgmma serialized because ordinary
# instructions touch an accumulator inside its asynchronous window); and if a report lacks one of
# the build's machine-code targets, so the check covers every target the build makes (the fat
# build: sm_75 to sm_120).
# Reads the -Xptxas -v reports the build keeps in BUILD/ptxas/<name>.txt and the build's targets
# from BUILD/flags.txt (every code=sm_XX of its -gencode flags; stage 6 compiles sm_90 as sm_90a).
# One line per check and "N passed, M failed, K skipped" last (common/tests/report.sh).
# usage: check_spills.sh BUILD_DIR NAME...   (NAME: a stage, or stage7_forward, stage 5's forward
#                                             compiled again for stage 7's library)
set -u
dir=$1; shift
. "$(dirname "$0")/report.sh"
targets=$(grep -oE 'code=sm_[0-9]+[af]?' "$dir/flags.txt" 2>/dev/null | sed 's/^code=//' | sort -u -V | tr '\n' ' ')
if [ -z "$targets" ]; then
  bad "no machine-code target (code=sm_XX) in $dir/flags.txt: which targets did the build make?"
  report_end
  exit 1
fi
for s in "$@"; do
  case $s in stage0_*) continue ;; esac
  f=$dir/ptxas/$s.txt
  if [ ! -s "$f" ]; then bad "$s: no ptxas report at $f"; continue; fi
  kernels=$(grep -c "Compiling entry function" "$f")
  missing=""
  for t in $targets; do
    grep -qE "Compiling entry function .* for '${t}a?'" "$f" || missing="$missing $t"
  done
  found=$(grep -E "[1-9][0-9]* bytes (stack frame|spill stores|spill loads)|Potential Performance Loss" "$f" |
    sort | uniq -c)
  if [ "$kernels" -gt 0 ] && [ -z "$found" ] && [ -z "$missing" ]; then
    ok "$s: $kernels kernel builds on ${targets% }: no spills, no stack frame, no performance warning"
  elif [ -n "$missing" ]; then
    bad "$s: no kernel compiled for$missing in $f (the build's targets: ${targets% })"
  else
    bad "$s spills, has a stack frame or a performance warning (or no kernels):"; echo "$found"
    grep -B3 -E "[1-9][0-9]* bytes (stack frame|spill)" "$f" | grep -E "Compiling|Function properties" | head -10
  fi
done
report_end
