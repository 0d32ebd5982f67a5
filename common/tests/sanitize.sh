#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck) on small shapes: both head dims, each with
# a tail tile and several key tiles per block (so every prefetch runs), causal and not, local
# windows and a softcap with N > N_k and N < N_k, a packed batch (--varlen: a sequence longer than
# a tile beside a short one and one without queries, causal, GQA), head dims 96 and 256 (these
# where the stage and variant take them: a run that exits unsupported is skipped); every
# variant of every stage. Any reported error fails. Every shape has a small grid (at most 6 query
# tiles per head and sequence), so stage 5 splits its keys (split-KV: partial results in the
# workspace, then its combine kernel) on any GPU; its nosplit variant runs the single pass.
# usage: [SANITIZER=path] sanitize.sh BUILD_DIR "TOOLS" STAGE...  (default: compute-sanitizer on PATH)
set -u
dir=$1 tools=$2; shift 2
passed=0 failed=0
. "$(dirname "$0")/../exit_codes.sh" || exit 1 # ATTN_EXIT_*: the programs' exit codes
shapes=("--seq 300 --dim 64 --batch 1 --heads 2 --causal" "--seq 130 --dim 128" "--seq 200 --dim 128 --causal --dist peaky"
  "--seq 333 --seq-k 200 --dim 128 --heads 4 --kv-heads 2 --window 20,10 --softcap 30"
  "--seq 64 --seq-k 500 --dim 64 --heads 2 --window 16,16"
  "--varlen 130:100,0:30,9 --dim 64 --heads 2 --kv-heads 1 --causal"
  "--seq 100 --dim 96 --heads 2 --causal" "--seq 80 --seq-k 140 --dim 256 --heads 2 --kv-heads 1")
takes_all=3 # the shapes from this index on run where a stage and variant take them
for s in "$@"; do
  # a stage that cannot run on this GPU at all (stage 6 off Hopper) is waived, not failed
  "$dir/$s" --seq 64 --dim 64 --check 0 >/dev/null 2>&1
  if [ $? -eq "$ATTN_EXIT_UNSUPPORTED" ]; then echo "$s: waived (does not run on this GPU)"; continue; fi
  variants=$("$dir/$s" --help | sed -n 's/.*--variant NAME *one of: //p' | tr ',' ' ')
  for v in $variants; do
    for t in $tools; do
      for i in "${!shapes[@]}"; do
        sh=${shapes[$i]}
        # shellcheck disable=SC2086
        out=$("${SANITIZER:-compute-sanitizer}" --tool "$t" --error-exitcode 9 "$dir/$s" $sh --variant "$v" --check all 2>&1)
        rc=$?
        [ $rc -eq "$ATTN_EXIT_UNSUPPORTED" ] && [ "$i" -ge "$takes_all" ] && continue
        if [ $rc -eq 0 ] && ! grep -q "ERROR SUMMARY: [1-9]" <<<"$out"; then
          passed=$((passed + 1))
        else
          failed=$((failed + 1))
          echo "FAILED: $t $s --variant $v $sh (exit $rc)"
          grep -E "ERROR SUMMARY|Error|error|Invalid|Race|hazard" <<<"$out" | head -8
        fi
      done
    done
  done
  echo "$s: sanitized"
done
echo "sanitize: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
