#!/usr/bin/env bash
# The labs on a GPU (stages with LAB HOLE markers; by default every one), each step under its own
# timeout, a summary last:
#   1. the unfilled lab: make grade fails, with a report card, its run (after the build) within
#      LIMIT seconds, and names no hang or crash;
#   2. the lab filled with the stage's own code: make grade passes (every hole, your file, speed);
#   3. each of the stage's wrong fills (below: one hole filled wrong on purpose, a plausible
#      learner's mistake; one for each design hole at least), one after the other: make grade
#      fails and the report card names that hole as FAIL and the others as PASS;
#   4. the T4 path of stages 3 and 5 and the capstone (ARCH=compute_75 SMEM_LIMIT=65536): the
#      filled lab passes there (stage 5's [t4] hole is also graded on that path in step 2: with
#      the self-test, or under QUICK=1 its quick cases).
# Stages 6 and 8 run only on sm_90a: on another GPU step 1 must say so (unsupported here), and steps
# 2-3 are skipped.
# QUICK=1 (the quick proof): the stages run side by side, and in each, steps 1 and 3 beside
# step 2 (each step has its own labs folder; a build of the same content is shared, make grade
# builds it once); steps 2, 3 and 4 grade with make grade QUICK=1 (the two quick cases, no
# self-test, no timing): what it skips is the self-test of the solution (the stage's own
# --self-test proves that code), of the wrongly filled lab's other holes (the quick cases still
# pass them) and of the T4 run of step 4, and step 2's speed. Step 1 is the same in both modes,
# but side by side its times are those of a shared machine.
# The labs go to a folder of their own (LABS=), never the learner's labs/.
# usage: common/tests/gpu_labs.sh [STAGE...]     (STAGE: a number or capstone; LIMIT=60, QUICK=0
#        by default; STEPS=23 runs those steps; GPU_LABS_DIR=DIR keeps the logs; a TERM prints what finished)
set -u
cd "$(dirname "$0")/../.."
all=$(grep -l -E '^[[:space:]]*// LAB HOLE [0-9]+ BEGIN' stage*/*.cu stage*/*.cuh stage*/*.h 2>/dev/null |
  sed -E 's|^stage([0-9]+)_.*|\1|' | sort -un | tr '\n' ' ')
grep -q -E '^[[:space:]]*// LAB HOLE [0-9]+ BEGIN' capstone/attention.cu 2>/dev/null && all="${all}capstone"
stages=${*:-$all}
limit=${LIMIT:-60}
quick=${QUICK:-0}
[ "$quick" = 0 ] && qarg="" || qarg="QUICK=1"
# GPU_LABS_DIR=DIR: the steps' folders and logs go there and stay (else a temporary folder)
if [ -n "${GPU_LABS_DIR:-}" ]; then
  top=$GPU_LABS_DIR
  rm -rf "$top" && mkdir -p "$top" || exit 2
else
  top=$(mktemp -d)
  trap 'rm -rf "$top"' EXIT
fi

# wrongs N: the wrong fills of stage N, one a line: HOLE<TAB>FILE<TAB>SED, a hole filled wrong
# on purpose as a learner might (FILE in the stage's folder, SED a sed script for it); each changes
# values, never hangs. A design hole (its TODO gives the specification, not the calls) has one at
# least. Add one: a line of the stage's printf below.
wrongs() {
  case $1 in
    # 2: the online-softmax update without the rescale (l_i, O_acc left on the old max);
    # 4: the key loop's tile count without the tail tile (an off-by-one tile bound)
    1) printf '%s\t%s\t%s\n' \
      2 attention.cu 's|const float alpha = expf(m_i - m_ref);|const float alpha = 1.f;|' \
      4 attention.cu 's|const int n_kv_tiles = causal ? last_row / BC + 1 : (N + BC - 1) / BC;|const int n_kv_tiles = causal ? last_row / BC + 1 : N / BC;|' ;;
    # 1: the scores read Q_smem unpadded, the Q tile written padded
    2) printf '%s\t%s\t%s\n' \
      1 attention.cu 's|load_chunk(&Q_smem\[tid \* (D + PAD) + d\], q);|load_chunk(\&Q_smem[tid * D + d], q);|' ;;
    # 2: the prefetch copies tile kt again, not kt + 1 (an off-by-one tile);
    # 3 (the T4 path): the next tile's V registers fetched from K (V_next gets K's rows)
    3) printf '%s\t%s\t%s\n' \
      2 attention.cu 's|load_tile_async<BC, D, LD, THREADS>(\([KV]\)_next, \([KV]\), k0 + BC, N, tid);|load_tile_async<BC, D, LD, THREADS>(\1_next, \2, k0, N, tid);|' \
      3 attention.cu 's|stash_k_fetch_v<D, BC, LD>(K_next, next, V, k0 + BC, N, tid);|stash_k_fetch_v<D, BC, LD>(K_next, next, K, k0 + BC, N, tid);|' ;;
    # 1: K^T's block n read from column 16n of K_smem, not from key row 16n;
    # 2: every element rescaled by this lane's own alpha, not by its row's (the hidden layout)
    4) printf '%s\t%s\t%s\n' \
      1 attention.cu 's|wmma::load_matrix_sync(K_frag, K_k + n \* WN \* LD, LD);|wmma::load_matrix_sync(K_frag, K_k + n * WN, LD);|' \
      2 attention.cu 's|O_acc\[n\].x\[e\] \*= alpha_e.x\[e\];|O_acc[n].x[e] *= alpha;|' ;;
    # 3: the swizzle's XOR with row % 4, not row % 8; 5: a row's max over two lanes of its quad,
    # not four (the second shuffle left out)
    5) printf '%s\t%s\t%s\n' \
      3 attention.cu 's|(SWIZZLE ? (chunk ^ (row \& 7)) : chunk)|(SWIZZLE ? (chunk ^ (row \& 3)) : chunk)|' \
      5 attention.cu 's|return fmaxf(mx, __shfl_xor_sync(FULL_WARP, mx, 2));|return mx;|' ;;
    # 1: every slab copied from column 0; 4: the running sum l not rescaled when the max grows
    6) printf '%s\t%s\t%s\n' \
      1 producer.cuh 's|map, full, c \* SLAB_COLS, row0, head, batch);|map, full, 0, row0, head, batch);|' \
      4 softmax.cuh 's|l_i\[h\] = l_i\[h\] \* r.alpha\[h\] + sum\[h\];|l_i[h] = l_i[h] + sum[h];|' ;;
    # 1: D_i's two rows swapped in dS; the causal mask drops the diagonal key (key >= query)
    7) printf '%s\t%s\t%s\n' \
      1 smem_kernel.cuh 's|(dP\[m\]\[n\]\[e\] - (frag_c(e) ? Di.y : Di.x))|(dP[m][n][e] - (frag_c(e) ? Di.x : Di.y))|' \
      1 smem_kernel.cuh 's|key >= p.N_k \|\| (p.causal \&\& key > query);|key >= p.N_k \|\| (p.causal \&\& key >= query);|' ;;
    # 3: dS^T stored without its warpgroup's 64 rows (both warpgroups write the first 64)
    8) printf '%s\t%s\t%s\n' 3 mainloop.cuh 's|const int row = wg_key0<D>(p.wg) + WARP_ROWS \* p.warp +|const int row = WARP_ROWS * p.warp +|' ;;
    # 2: the key warps' sums l added without their weights (O weighed, l not)
    9) printf '%s\t%s\t%s\n' 2 attention.cu 's|sum += w \* row\[D + 1\];|sum += row[D + 1];|' ;;
    # 1: the partial's weight not normalised; 2: the next keys received into the buffer the
    # step computes from (the next step reads one nothing wrote); 3: dK's accumulator restarted
    # at every step (the sum so far dropped). Stage 10 grades on two GPUs only.
    10) printf '%s\t%s\t%s\n' \
      1 ring.cu 's|const float wb = merged == -INFINITY ? 0.f : expf(lse_b - merged);|const float wb = merged == -INFINITY ? 0.f : expf(lse_b - top);|' \
      2 ring.cu 's|ncclRecv(G->k_buf\[next\], in,|ncclRecv(G->k_buf[t % STEP_BUFFERS], in,|' \
      3 ring.cu 's|const float \*ak = t == 0 ? NULL : G->dk_buf\[here\],|const float *ak = NULL,|' ;;
    # the capstone's one hole: the scores scaled by 1.25 x the given scale; causal read backwards
    capstone) printf '%s\t%s\t%s\n' \
      1 attention.cu 's|return attention_forward(s, dev,|attn_shape t = *s; t.scale *= 1.25f; return attention_forward(\&t, dev,|' \
      1 attention.cu 's|return attention_forward(s, dev,|attn_shape t = *s; t.causal = !t.causal; return attention_forward(\&t, dev,|' ;;
  esac
}

# hopper_only DIR: a stage whose kernels exist in sm_90a code only (6 and 8)
hopper_only() {
  [ "${1#stage6_}" != "$1" ] || [ "${1#stage8_}" != "$1" ]
}

# step N STEP: one step of stage N in its own labs folder ($top/labs<N>-<STEP>); its lines go to
# stdout, its results to $top/<N>-<STEP>.sum ("ok"/"FAIL" lines)
step() {
  local n=$1 s=$2 dir L tmp lab_files cc
  dir=$(ls -d stage"$n"_* 2>/dev/null | head -n 1)
  [ -n "$dir" ] || dir=$n  # the capstone's folder is its name
  L=$top/labs$n-$s tmp=$top/tmp$n-$s
  mkdir -p "$tmp"
  say() { echo "$*" >>"$top/$n-$s.sum"; echo "$*"; }
  ok() { say "ok    $*"; }
  bad() { say "FAIL  $*"; sed 's/^/      /' "$tmp/out" | tail -n 20; }
  grade() { # grade SECONDS [make args...]: make grade under a timeout, output in $tmp/out
    local secs=$1; shift
    local t0; t0=$(date +%s)
    timeout "$secs" env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u QUICK make --no-print-directory grade STAGE="$n" LABS="$L" "$@" >"$tmp/out" 2>&1
    rc=$? took=$(($(date +%s) - t0))
    cat "$tmp/out"
  }
  fill_solution() { for f in $lab_files; do cp "$dir/$f" "$L/$dir/$f"; done; }
  : >"$tmp/out"
  echo "[$(date +%T)] stage $n, step $s starts"
  rm -rf "$L"
  env -u MAKEFLAGS make --no-print-directory lab STAGE="$n" LABS="$L" >/dev/null || { bad "make lab STAGE=$n"; return; }
  lab_files=$(cd "$L/$dir" && ls)
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
  if hopper_only "$dir" && [ "$cc" != 90 ] && [ "$s" != 1 ]; then
    return  # stage 6 or 8 on another GPU: step 1 says it is unsupported, the rest cannot run
  fi
  case $s in
  1) # the unfilled lab
    grade 900
    run_s=$(grep -m 1 -oE '^  yours: FAIL \(build [0-9]+ s, run [0-9]+ s\)' "$tmp/out" | grep -oE 'run [0-9]+' | grep -oE '[0-9]+')
    if [ "$rc" -eq 124 ]; then
      bad "stage $n, unfilled lab: make grade did not finish in 900 s"
    elif hopper_only "$dir" && [ "$cc" != 90 ]; then
      if [ "$rc" -ne 0 ] && grep -q 'unsupported here' "$tmp/out"; then
        ok "stage $n on sm_$cc: make grade says it cannot run here (sm_90a only): $(grep -m 1 -o 'unsupported here.*' "$tmp/out" | cut -c1-120); steps 2-3 skipped"
      else
        bad "stage $n on sm_$cc: make grade should say the stage is unsupported here"
      fi
    elif [ "$rc" -ne 0 ] && grep -q '^Report card' "$tmp/out" && grep -q 'not started' "$tmp/out" &&
      ! grep -q -E 'did not finish|crashed' "$tmp/out" && [ -n "$run_s" ] && [ "$run_s" -le "$limit" ]; then
      ok "stage $n, unfilled lab: fails with a report card, its run in $run_s s (limit $limit s; $took s with the build), no hang, no crash: $(grep -m 1 -E '^  your file ' "$tmp/out" | sed 's/  */ /g' | cut -c1-140)"
    else
      bad "stage $n, unfilled lab: exit $rc after $took s (run ${run_s:-?} s): want a failing report card, its run within $limit s"
    fi ;;
  2) # the stage's own code (QUICK=1: its quick cases, not timed)
    fill_solution
    grade 900 $qarg
    if [ "$rc" -eq 0 ] && grep -q -E '^holes passing: ([0-9]+) of \1$' "$tmp/out" && grep -q -E "of (the stage.s own kernel|stage 5.s kernel).s speed" "$tmp/out"; then
      ok "stage $n, the solution: passes every hole and is timed ($took s; $(grep -o -E "[0-9.]* of (the stage.s own kernel|stage 5.s kernel).s speed" "$tmp/out"))"
    elif [ -n "$qarg" ] && [ "$rc" -eq 0 ] && grep -q -E '^holes passing: ([0-9]+) of \1$' "$tmp/out" && grep -q '^  quick grade:' "$tmp/out"; then
      ok "stage $n, the solution (QUICK=1): passes every hole on the quick cases ($took s; not timed)"
    else
      bad "stage $n, the solution: exit $rc after $took s: want every hole passing${qarg:- and a speed}"
    fi ;;
  3) # each wrong fill, one after the other
    [ -n "$(wrongs "$n")" ] || { say "FAIL  stage $n: no wrong fill (wrongs() below has none)"; return; }
    local hole file edit others
    while IFS=$'\t' read -r -u 3 hole file edit; do  # fd 3: make and the programs keep stdin
      fill_solution
      sed "$edit" "$dir/$file" >"$L/$dir/$file"
      if cmp -s "$L/$dir/$file" "$dir/$file"; then
        say "FAIL  stage $n, hole $hole: the wrong fill did not change $file (its sed is stale)"
        continue
      fi
      grade 900 $qarg
      others=$(grep -E '^  hole [0-9]+ ' "$tmp/out" | grep -v -E "^  hole $hole " | grep -c ' FAIL ')
      if [ "$rc" -ne 0 ] && grep -q -E "^  hole $hole .* FAIL +(first failing case|self-test)" "$tmp/out" && [ "$others" -eq 0 ]; then
        ok "stage $n, hole $hole filled wrong on purpose${qarg:+ ($qarg)}: caught and named ($took s): $(grep -E "^  hole $hole " "$tmp/out" | sed 's/  */ /g' | cut -c1-160)"
      else
        bad "stage $n, hole $hole filled wrong on purpose: exit $rc; want hole $hole FAIL with its first failing case, the others PASS"
      fi
    done 3< <(wrongs "$n") ;;
  4) # the T4 path (stages 3 and 5: their sm_75 code is a hole of the lab; the capstone runs there)
    fill_solution
    grade 900 ARCH=compute_75 SMEM_LIMIT=65536 $qarg
    if [ "$rc" -eq 0 ] && grep -q 'ARCH=compute_75, --smem-limit 65536' "$tmp/out" && grep -q -E '^holes passing: ([0-9]+) of \1$' "$tmp/out"; then
      ok "stage $n on the T4 path (ARCH=compute_75 SMEM_LIMIT=65536${qarg:+, $qarg}): the solution passes ($took s)"
    else
      bad "stage $n on the T4 path: exit $rc; want every hole passing"
    fi ;;
  esac
}

# run_stage N: the steps of stage N, one after the other (QUICK=1: steps 1 and 3 beside step 2,
# whose build folders they share where the content is the same; step 4 after step 2)
run_stage() {
  local n=$1 steps=123
  case $n in 3 | 5 | capstone) steps=1234 ;; esac
  [ -n "${STEPS:-}" ] && steps=$(echo "$steps" | tr -c -d "$STEPS")  # STEPS=23: those steps alone
  if [ "$quick" = 0 ]; then
    for s in $(echo $steps | grep -o .); do step "$n" "$s"; done
    return
  fi
  case $steps in *1*) step "$n" 1 >"$top/$n-1.out" 2>&1 & ;; esac
  case $steps in *3*) step "$n" 3 >"$top/$n-3.out" 2>&1 & ;; esac
  { case $steps in *2*) step "$n" 2 ;; esac; case $steps in *4*) step "$n" 4 ;; esac; } >"$top/$n-2.out" 2>&1
  wait
  cat "$top/$n-1.out" "$top/$n-2.out" "$top/$n-3.out" 2>/dev/null
}

# summary [WORDS]: the steps' results so far, counted
summary() {
  echo
  echo "== summary ($(($(date +%s) - t0)) s${qarg:+, $qarg}${1:+, $1})"
  cat "$top"/*.sum 2>/dev/null
  passed=$(cat "$top"/*.sum 2>/dev/null | grep -c '^ok ')
  failed=$(cat "$top"/*.sum 2>/dev/null | grep -c '^FAIL ')
  echo "$passed passed, $failed failed"
}

# Stopped (a timeout's TERM, or ^C): what finished is printed, with the last lines of each step
# still running, and every step is stopped with it.
stopped() {
  trap "" TERM INT
  for f in "$top"/*-[1-4].out; do
    [ -f "$f" ] || continue
    echo "== $(basename "$f" .out), its last lines when stopped"
    tail -n 8 "$f" | cut -c1-240
  done
  summary "stopped before the end"
  # every process of this run (the grades run under timeouts, in process groups of their own)
  for e in /proc/[0-9]*/environ; do
    pid=${e#/proc/} && pid=${pid%/environ}
    [ "$pid" != $$ ] && grep -q -z -x "GPU_LABS_RUN=$top" "$e" 2>/dev/null && kill -TERM "$pid" 2>/dev/null
  done
  exit 124
}
export GPU_LABS_RUN=$top
trap stopped TERM INT

nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader || { echo "no GPU here"; exit 2; }
t0=$(date +%s)
if [ "$quick" = 0 ]; then
  for n in $stages; do run_stage "$n"; done
else  # side by side: each stage's build folders and labs are its own
  for n in $stages; do run_stage "$n" >"$top/$n.out" 2>&1 & done
  wait
  for n in $stages; do echo "== stage $n"; cat "$top/$n.out"; done
fi
summary
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
