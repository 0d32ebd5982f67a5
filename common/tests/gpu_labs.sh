#!/usr/bin/env bash
# The labs on a GPU (stages with LAB HOLE markers; by default 1, 2 and 3), each step under its own
# timeout, a summary last:
#   1. the unfilled lab: make grade fails, with a report card, within LIMIT seconds (build
#      included), and names no hang or crash;
#   2. the lab filled with the stage's own code: make grade passes (every hole, your file, speed);
#   3. one hole filled wrong on purpose (below, per stage): make grade fails and the report card
#      names that hole as FAIL and the others as PASS;
#   4. the T4 path of one lab (ARCH=compute_75 SMEM_LIMIT=65536): the filled lab passes there.
# The labs go to a folder of their own (LABS=), never the learner's labs/.
# usage: common/tests/gpu_labs.sh [STAGE...]     (LIMIT=60 by default)
set -u
cd "$(dirname "$0")/../.."
stages=${*:-1 2 3}
limit=${LIMIT:-60}
passed=0 failed=0
summary=()
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
L=$tmp/labs
say() { echo "$*"; summary+=("$*"); }
ok() { passed=$((passed + 1)); say "ok    $*"; }
bad() { failed=$((failed + 1)); say "FAIL  $*"; sed 's/^/      /' "$tmp/out" | tail -n 20; }
grade() { # grade STAGE SECONDS [make args...]: make grade under a timeout, output in $tmp/out
  local n=$1 secs=$2; shift 2
  local t0; t0=$(date +%s)
  timeout "$secs" env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory grade STAGE="$n" LABS="$L" "$@" >"$tmp/out" 2>&1
  rc=$? took=$(($(date +%s) - t0))
  cat "$tmp/out"
}
# wrong N: the stage's file with one hole broken on purpose; sets $hole (the hole it breaks)
wrong() {
  case $1 in
    1) hole=2; sed 's|const float alpha = expf(m_i - m_ref);|const float alpha = 1.f;|' ;;
    2) hole=1; sed 's|load_chunk(&Q_smem\[tid \* (D + PAD) + d\], q);|load_chunk(\&Q_smem[tid * D + d], q);|' ;;
    3) hole=2; sed 's|load_tile_async<BC, D, D, BR>(\([KV]\)_next, \([KV]\), k0 + BC, N, tid);|load_tile_async<BC, D, D, BR>(\1_next, \2, k0, N, tid);|' ;;
    *) hole=0; cat ;;
  esac
}
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader || { echo "no GPU here"; exit 2; }
for n in $stages; do
  dir=$(ls -d stage"$n"_* | head -n 1)
  lab=$L/$dir/attention.cu
  rm -rf "$L"
  env -u MAKEFLAGS make --no-print-directory lab STAGE="$n" LABS="$L" >/dev/null || { bad "make lab STAGE=$n"; continue; }
  # 1. unfilled
  grade "$n" "$((limit + 30))"
  if [ "$rc" -eq 124 ]; then
    bad "stage $n, unfilled lab: make grade did not finish in $((limit + 30)) s"
  elif [ "$rc" -ne 0 ] && grep -q '^Report card' "$tmp/out" && grep -q 'not started' "$tmp/out" &&
    ! grep -q -E 'did not finish|crashed' "$tmp/out" && [ "$took" -le "$limit" ]; then
    ok "stage $n, unfilled lab: fails with a report card in $took s (limit $limit s), no hang, no crash"
  else
    bad "stage $n, unfilled lab: exit $rc after $took s: want a failing report card within $limit s"
  fi
  # 2. the stage's own code
  cp "$dir/attention.cu" "$lab"
  grade "$n" 590
  if [ "$rc" -eq 0 ] && grep -q -E '^holes passing: ([0-9]+) of \1$' "$tmp/out" && grep -q 'of the stage.s own kernel.s speed' "$tmp/out"; then
    ok "stage $n, the solution: passes every hole and is timed ($took s; $(grep -o '[0-9.]* of the stage.s own kernel.s speed' "$tmp/out"))"
  else
    bad "stage $n, the solution: exit $rc after $took s: want every hole passing and a speed"
  fi
  # 3. one hole wrong on purpose
  wrong "$n" <"$dir/attention.cu" >"$lab"
  if cmp -s "$lab" "$dir/attention.cu"; then
    failed=$((failed + 1)); say "FAIL  stage $n: the wrong fill did not change the file (its sed is stale)"
  else
    grade "$n" 590
    others=$(grep -E '^  hole [0-9]+ ' "$tmp/out" | grep -v -E "^  hole $hole " | grep -c ' FAIL ')
    if [ "$rc" -ne 0 ] && grep -q -E "^  hole $hole .* FAIL +(first failing case|self-test)" "$tmp/out" && [ "$others" -eq 0 ]; then
      ok "stage $n, hole $hole filled wrong on purpose: caught and named ($took s): $(grep -E "^  hole $hole " "$tmp/out" | sed 's/  */ /g' | cut -c1-160)"
    else
      bad "stage $n, hole $hole filled wrong on purpose: exit $rc; want hole $hole FAIL with its first failing case, the others PASS"
    fi
  fi
done
# 4. the T4 path of lab 3 (or the first stage given), filled with the stage's code
n=$(echo "$stages" | tr ' ' '\n' | grep -x 3 || echo "$stages" | awk '{print $1}')
dir=$(ls -d stage"$n"_* | head -n 1)
rm -rf "$L"
env -u MAKEFLAGS make --no-print-directory lab STAGE="$n" LABS="$L" >/dev/null
cp "$dir/attention.cu" "$L/$dir/attention.cu"
grade "$n" 590 ARCH=compute_75 SMEM_LIMIT=65536
if [ "$rc" -eq 0 ] && grep -q 'ARCH=compute_75, --smem-limit 65536' "$tmp/out" && grep -q -E '^holes passing: ([0-9]+) of \1$' "$tmp/out"; then
  ok "stage $n on the T4 path (ARCH=compute_75 SMEM_LIMIT=65536): the solution passes ($took s)"
else
  bad "stage $n on the T4 path: exit $rc; want every hole passing"
fi
echo
echo "== summary"
printf '%s\n' "${summary[@]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
