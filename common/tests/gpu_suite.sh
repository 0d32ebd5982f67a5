#!/usr/bin/env bash
# One GPU session's checks in one command: builds (native, and PTX-only compute_75 / compute_89
# for the T4 and L4 paths), every stage's --self-test on each (stages in parallel), the
# sanitizers, random shapes checked whole (common/tests/fuzz.py, on each build), and a small
# timing table. Logs go to $LOGS (default build/gpu-logs); a summary
# is printed last.
# Stage 10 (a program of its own, NCCL's) in the part `cp`: make cp-build (its program and the
# stage libraries it loads), its --self-test on every GPU here (one GPU: the ring of one).
# usage: gpu_suite.sh [build] [selftest] [t4] [l4] [sanitize] [fuzz] [bench] [cp]   (default: all)
#        STAGES="stage4_wmma stage5_tuned" limits the stages; NATIVE=dir names a prebuilt build.
set -u
cd "$(dirname "$0")/../.."
export PATH=/usr/local/cuda/bin:$PATH
LOGS=${LOGS:-build/gpu-logs}
mkdir -p "$LOGS"
parts=${*:-build selftest t4 l4 sanitize fuzz bench cp}
stages=${STAGES:-$(ls stage[0-9]*/attention.cu | cut -d/ -f1 | sort)}
native=${NATIVE:-build/sm90}
summary=$LOGS/summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }
has() { [[ " $parts " == *" $1 "* ]]; }
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }

say "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader) | $(nvcc --version | tail -n 1)"
if has build; then
  pids=()
  # prebuilt binaries (carried from a machine with the same toolkit) are used when they run
  for b in "$native:90" build/c75:compute_75 build/c89:compute_89; do
    if ! "${b%%:*}/stage0_naive" --help >/dev/null 2>&1; then
      make -j6 build ARCH="${b##*:}" BUILD="${b%%:*}" >"$LOGS/build_${b##*:}.log" 2>&1 & pids+=($!)
    fi
  done
  for p in "${pids[@]}"; do wait "$p" || say "a build failed: see $LOGS/build_*.log"; done
  grep -h -B2 -A3 "error" "$LOGS"/build_*.log | head -20
  stamp "builds done"
fi
selftest() { # selftest BUILD LABEL [ARGS]: every stage at once, 2 OpenMP threads each
  local b=$1 label=$2; shift 2
  for s in $stages; do
    [ -x "$b/$s" ] || { echo "NOT BUILT" >"$LOGS/selftest_${label}_$s.log"; continue; }
    OMP_NUM_THREADS=2 timeout 400 "$b/$s" --self-test "$@" >"$LOGS/selftest_${label}_$s.log" 2>&1 &
  done
}
report() {
  local label=$1
  for s in $stages; do
    local f=$LOGS/selftest_${label}_$s.log
    say "self-test $label $s: $(tail -n 1 "$f") ($(grep -h 'self-test on' "$f" | sed 's/.*: //'))"
    grep -h "FAILED" "$f" | head -3
  done
}
if has cp; then # stage 10: its own build (NCCL) and self-test, beside the others' self-tests
  ( make -j6 cp-build ARCH=90 BUILD="$native" >"$LOGS/build_cp.log" 2>&1 &&
    OMP_NUM_THREADS=2 timeout 400 "$native/stage10_context_parallel" --self-test >"$LOGS/selftest_cp.log" 2>&1 ||
    echo "build or self-test failed (exit $?): $LOGS/build_cp.log" >>"$LOGS/selftest_cp.log" ) &
fi
# self-tests and sanitizers all at once (none of it is timed)
has selftest && selftest "$native" native
has t4 && selftest build/c75 t4 --smem-limit 65536
has l4 && selftest build/c89 l4 --smem-limit 101376
if has sanitize; then
  for s in $stages; do
    [ -x "$native/$s" ] || continue
    timeout 400 bash common/tests/sanitize.sh "$native" "memcheck racecheck synccheck" "$s" >"$LOGS/sanitize_$s.log" 2>&1 &
  done
fi
wait
stamp "self-tests and sanitizers done"
for l in native t4 l4; do has "${l/native/selftest}" && report "$l"; done
has cp && say "self-test stage10_context_parallel: $(tail -n 1 "$LOGS/selftest_cp.log" 2>/dev/null)"
if has sanitize; then
  for s in $stages; do say "sanitize $s: $(tail -n 1 "$LOGS/sanitize_$s.log")"; grep -h FAILED "$LOGS/sanitize_$s.log" | head -3; done
fi
if has fuzz; then # after the self-tests: each case's float64 check takes two cores
  # each build's random shapes; then smaller ones under memcheck (an access out of bounds that
  # the poisoned outputs cannot show)
  for b in "$native:native::60" build/c75:t4:65536:60 build/c89:l4:101376:60 "$native:memcheck::12"; do
    IFS=: read -r dir label smem cases <<<"$b"
    [ -x "$dir/stage5_tuned" ] || continue
    wrap=()
    if [ "$label" = memcheck ]; then
      command -v compute-sanitizer >/dev/null || continue
      wrap=(--wrap "compute-sanitizer --error-exitcode 9" --max-work 2e7)
    fi
    ss=$(for s in $stages; do [ -x "$dir/$s" ] && echo "$s"; done)
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=2 timeout 600 python3 common/tests/fuzz.py "$dir" $ss --cases "$cases" --jobs 6 \
      ${smem:+--extra "--smem-limit $smem"} "${wrap[@]}" >"$LOGS/fuzz_$label.log" 2>&1
    say "fuzz $label: $(tail -n 1 "$LOGS/fuzz_$label.log")"
    grep -h -A2 "^FAIL" "$LOGS/fuzz_$label.log" | head -6
  done
  stamp "fuzz done"
fi
if has bench; then
  say "bench (median ms, TFLOP/s, max_abs_err, status):"
  for s in $stages; do
    [ -x "$native/$s" ] || continue
    variants=$("$native/$s" --help | sed -n 's/.*--variant NAME *one of: //p' | tr ',' ' ')
    for v in $variants; do
      # the last: a packed batch (--varlen random: 16 sequences of 0 .. 8,192 tokens), where taken
      for shape in "--batch 4 --heads 16 --seq 4096 --dim 128" "--seq 65536 --dim 128" \
        "--varlen random --batch 16 --seq 8192 --heads 16 --dim 128 --causal"; do
        # every row the program prints (a backward stage: bwd, then fwd+bwd), by its header's names
        rows=$(timeout 300 "$native/$s" $shape --variant "$v" --bench --csv --check 16 --budget 20 \
          2>>"$LOGS/bench.log" | awk -F, '/^gpu,/ { for (i = 1; i <= NF; i++) c[$i] = i; next }
          ("ms_median" in c) && NF >= c["status"] {
            printf "  %-20s %-12s %-7s B=%s H=%-2s N=%-6s D=%s %10s ms %8s TFLOP/s  err %-9s %s\n",
              $c["stage"], $c["variant"], $c["pass"], $c["B"], $c["H"], $c["N"], $c["D"],
              $c["ms_median"], $c["tflops"], $c["max_abs_err"], $c["status"] }')
        say "${rows:-  $s $v [$shape]: no row (see $LOGS/bench.log)}"
      done
    done
  done
  stamp "bench done"
fi
echo "==== summary"
cat "$summary"
