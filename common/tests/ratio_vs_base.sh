#!/usr/bin/env bash
# Speed of a new build against a base build, stage by stage, on the fa2 shapes of
# plots/shapes.conf (B x N = 16,384 tokens, H = 2048 / D, D in {64, 128}, causal 0 and 1,
# N = FA2_N): for a change that must not slow a stage down (one build from before it, one from
# after, same GPU). Not run by `make test`: it needs a GPU and two builds.
# Each shape runs `PROGRAM --batch B --heads H --seq N --dim D [--causal] --bench --csv --check 0
# --budget S` from both builds, base then new, and the whole set twice (rounds interleaved, so a
# clock or thermal drift hits both); the faster ms_median of each build's rounds is kept (a
# backward stage's `bwd` row: its `fwd+bwd` row holds another stage's forward).
# A shape over the budget (either build's first launch took longer than S seconds: the program's
# own over_budget row) is skipped, and so is every larger N of its series (the work grows with N).
# Prints one line per shape, "ratio" = base ms / new ms (above 1: the new build is faster), then
# per stage "STAGE: geomean G, min M over K shapes (worst: shape)".
# usage: ratio_vs_base.sh [--budget S] [--rounds R] BASE_DIR NEW_DIR STAGE...
#   BASE_DIR, NEW_DIR: the build folders holding the stage programs (build/stage1_scalar_flash, ...)
#   --budget S: seconds one launch may take (default 10); --rounds R: rounds (default 2)
# e.g.  bash common/tests/ratio_vs_base.sh /work/base-build build stage1_scalar_flash stage4_wmma
# Exit: 0 when every shape ran or was skipped over budget, 1 when a run failed, 2 on a usage error.
set -u
cd "$(dirname "$0")/../.."
usage() {
  echo "usage: ratio_vs_base.sh [--budget S] [--rounds R] BASE_DIR NEW_DIR STAGE..." >&2
  [ $# -gt 0 ] && echo "ratio_vs_base.sh: $*" >&2
  exit 2
}
budget=10 rounds=2
while [ $# -gt 0 ]; do
  case $1 in
  --budget) [ $# -ge 2 ] || usage "--budget needs a number of seconds"; budget=$2; shift 2 ;;
  --rounds) [ $# -ge 2 ] || usage "--rounds needs a count"; rounds=$2; shift 2 ;;
  --) shift; break ;;
  -*) usage "unknown option '$1'" ;;
  *) break ;;
  esac
done
[ $# -ge 3 ] || usage
awk -v b="$budget" 'BEGIN { exit !(b + 0 > 0 && b ~ /^[0-9]*\.?[0-9]+$/) }' ||
  usage "--budget must be a positive number of seconds, got '$budget'"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || usage "--rounds must be a positive whole number, got '$rounds'"
base=$1 new=$2
shift 2
for s in "$@"; do
  for d in "$base" "$new"; do
    [ -x "$d/$s" ] || usage "no program $d/$s (build it first)"
  done
done
. plots/shapes.conf # FA2_N

col() { # col HEADER ROW NAME: the field of ROW under NAME in HEADER
  awk -F, -v h="$1" -v r="$2" -v want="$3" 'BEGIN {
    n = split(h, H, ","); split(r, R, ","); for (i = 1; i <= n; i++) if (H[i] == want) print R[i] }'
}

# run PROGRAM ARGS...: prints the ms_median of the run (a backward stage's: the backward alone),
# "over" when over budget, "" on a failure
run() {
  local out hdr row status
  out=$("$@" --bench --csv --check 0 --budget "$budget" 2>/dev/null)
  hdr=$(grep -m 1 '^gpu,' <<<"$out")
  # the backward's row where the program prints one (a backward stage's rows: bwd, fwd+bwd, whose
  # forward is another stage's), else the last row
  row=$(awk -F, 'f && NF { r = $0; if (p && $p == "bwd") b = $0 }
    /^gpu,/ { f = 1; for (i = 1; i <= NF; i++) if ($i == "pass") p = i }
    END { print (b != "" ? b : r) }' <<<"$out")
  [ -n "$hdr" ] && [ -n "$row" ] || return 0
  status=$(col "$hdr" "$row" status)
  case $status in
  ok) col "$hdr" "$row" ms_median ;;
  over_budget) echo over ;;
  esac
}

failed=0
for s in "$@"; do
  ratios=""
  for D in 64 128; do
    for causal in 0 1; do
      over=""
      for N in $FA2_N; do
        B=$((16384 / N)) H=$((2048 / D))
        shape="N=$N D=$D causal=$causal B=$B H=$H"
        if [ -n "$over" ]; then
          printf '%-20s %-40s skipped: over budget at %s\n' "$s" "$shape" "$over"
          continue
        fi
        args=(--batch $B --heads $H --seq $N --dim $D)
        [ $causal = 1 ] && args+=(--causal)
        best_b="" best_n="" bad=""
        for ((r = 0; r < rounds; r++)); do
          tb=$(run "$base/$s" "${args[@]}")
          tn=$(run "$new/$s" "${args[@]}")
          if [ "$tb" = over ] || [ "$tn" = over ]; then over="N=$N"; break; fi
          if [ -z "$tb" ] || [ -z "$tn" ]; then bad="run failed (base: ${tb:-failed}, new: ${tn:-failed})"; break; fi
          best_b=$(awk -v a="$tb" -v b="$best_b" 'BEGIN { print (b == "" || a + 0 < b + 0) ? a : b }')
          best_n=$(awk -v a="$tn" -v b="$best_n" 'BEGIN { print (b == "" || a + 0 < b + 0) ? a : b }')
        done
        if [ -n "$over" ]; then
          printf '%-20s %-40s skipped: over the %s s budget\n' "$s" "$shape" "$budget"
        elif [ -n "$bad" ]; then
          failed=1
          printf '%-20s %-40s FAILED: %s\n' "$s" "$shape" "$bad"
        else
          ratio=$(awk -v b="$best_b" -v n="$best_n" 'BEGIN { printf "%.4f", b / n }')
          ratios+="$ratio $shape"$'\n'
          printf '%-20s %-40s base %9.4f ms  new %9.4f ms  ratio %s\n' "$s" "$shape" "$best_b" "$best_n" "$ratio"
        fi
      done
    done
  done
  if [ -z "$ratios" ]; then
    echo "$s: no shape ran"
  else
    awk -v s="$s" 'NF { n++; lg += log($1); if (n == 1 || $1 < min) { min = $1; worst = $0 } }
      END { sub(/^[^ ]+ /, "", worst)
            printf "%s: geomean %.4f, min %.4f over %d shapes (worst: %s)\n", s, exp(lg / n), min, n, worst }' <<<"$ratios"
  fi
done
exit $failed
