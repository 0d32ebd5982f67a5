#!/usr/bin/env bash
# Fails if any kernel of stages 1-6 spills or has a stack frame on any target compiled, or if
# ptxas reports a "Potential Performance Loss" (for stage 6: wgmma serialized because ordinary
# instructions touch an accumulator inside its asynchronous window).
# Reads the -Xptxas -v reports the build keeps in BUILD/ptxas/<stage>.txt.
# usage: check_spills.sh BUILD_DIR STAGE...
set -u
dir=$1; shift
passed=0 failed=0
for s in "$@"; do
  case $s in stage0_*) continue ;; esac
  f=$dir/ptxas/$s.txt
  if [ ! -s "$f" ]; then echo "FAILED: $s: no ptxas report at $f"; failed=$((failed + 1)); continue; fi
  targets=$(grep -c "Compiling entry function" "$f")
  bad=$(grep -E "[1-9][0-9]* bytes (stack frame|spill stores|spill loads)|Potential Performance Loss" "$f" |
    sort | uniq -c)
  if [ "$targets" -gt 0 ] && [ -z "$bad" ]; then
    passed=$((passed + 1))
    echo "$s: $targets kernel builds, no spills, no stack frame, no performance warning"
  else
    failed=$((failed + 1))
    echo "FAILED: $s spills, has a stack frame or a performance warning (or no kernels):"; echo "$bad"
    grep -B3 -E "[1-9][0-9]* bytes (stack frame|spill)" "$f" | grep -E "Compiling|Function properties" | head -10
  fi
done
echo "spill check: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
