#!/usr/bin/env bash
# One GPU session's worth of checks in one command: builds (native, and PTX-only compute_75 /
# compute_89 for the T4 and L4 paths), every stage's --self-test on each, compute-sanitizer,
# and a few timings. Logs go to $LOGS (default build/gpu-logs); a summary is printed last.
# usage: gpu_suite.sh [build] [selftest] [t4] [l4] [sanitize] [bench] [fa2]   (default: all)
#        STAGES="stage4_wmma stage5_tuned" limits the stages.
set -u
cd "$(dirname "$0")/../.."
export PATH=/usr/local/cuda/bin:$PATH
LOGS=${LOGS:-build/gpu-logs}
mkdir -p "$LOGS"
parts=${*:-build selftest t4 l4 sanitize bench fa2}
stages=${STAGES:-$(ls -d stage[0-9]*/ | tr -d / | sort)}
summary=$LOGS/summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }
has() { [[ " $parts " == *" $1 "* ]]; }
native=build/sm90

say "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader) | $(nvcc --version | tail -n 1)"
if has build; then
  (make -j8 build ARCH=90 BUILD=build/sm90 >"$LOGS/build_sm90.log" 2>&1; echo "build sm_90: exit $?" >>"$summary") &
  (make -j4 build ARCH=compute_75 BUILD=build/c75 >"$LOGS/build_c75.log" 2>&1; echo "build compute_75: exit $?" >>"$summary") &
  (make -j4 build ARCH=compute_89 BUILD=build/c89 >"$LOGS/build_c89.log" 2>&1; echo "build compute_89: exit $?" >>"$summary") &
  wait
  cat "$summary" | tail -n 3
  grep -h -E "error|Error" "$LOGS"/build_*.log | head -20
fi
selftest() { # selftest BUILD LABEL [ARGS]
  local b=$1 label=$2; shift 2
  for s in $stages; do
    [ -x "$b/$s" ] || { say "$label $s: NOT BUILT"; continue; }
    timeout 600 "$b/$s" --self-test "$@" >"$LOGS/selftest_${label}_$s.log" 2>&1
    say "$label $s: $(tail -n 1 "$LOGS/selftest_${label}_$s.log") ($(grep -h 'self-test on' "$LOGS/selftest_${label}_$s.log" | sed 's/.*: //'))"
    grep -h "FAILED" "$LOGS/selftest_${label}_$s.log" | head -5
  done
}
has selftest && selftest "$native" native
has t4 && selftest build/c75 t4 --smem-limit 65536
has l4 && selftest build/c89 l4 --smem-limit 101376
if has sanitize; then
  for s in $stages; do
    [ -x "$native/$s" ] || continue
    bash common/tests/sanitize.sh "$native" "memcheck racecheck synccheck" "$s" >"$LOGS/sanitize_$s.log" 2>&1
    say "sanitize $s: $(tail -n 1 "$LOGS/sanitize_$s.log")"
  done
fi
if has bench; then
  say "bench (ms median, TFLOP/s) at fa2 D=128 N=4096 B=4 H=16 and long N=65536 B=H=1 D=128:"
  for s in $stages; do
    [ -x "$native/$s" ] || continue
    variants=$("$native/$s" --help | sed -n 's/.*--variant NAME *one of: //p' | tr ',' ' ')
    for v in $variants; do
      for shape in "--batch 4 --heads 16 --seq 4096 --dim 128" "--seq 65536 --dim 128"; do
        row=$(timeout 300 "$native/$s" $shape --variant "$v" --bench --csv --check 16 --budget 20 2>>"$LOGS/bench.log" | tail -n 1)
        say "  $(echo "$row" | awk -F, '{printf "%-20s %-12s N=%-6s B=%s H=%-2s %9s ms %8s TFLOP/s  err %s  %s", $2, $3, $6, $4, $5, $10, $13, $14, $19}')"
      done
    done
  done
fi
if has fa2 && [ -x "$native/stage5_tuned" ] && [ -f stage5_tuned/compare_fa2.py ]; then
  python3 stage5_tuned/compare_fa2.py --binary "$native/stage5_tuned" ${FA2_ARGS:-} >"$LOGS/fa2.log" 2>&1
  tail -n 30 "$LOGS/fa2.log" | tee -a "$summary"
fi
echo "==== summary"
cat "$summary"
