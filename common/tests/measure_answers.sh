#!/usr/bin/env bash
# The lessons' exercise answers measured in one GPU session, on the kernels as they are now:
#   - stage 1 exercise 4 (the causal skip), stage 2 exercise 3 (other paddings), stage 3 exercise 3
#     (double buffering's shared memory), stage 6 exercise 5 (--smem-limit picks no other layout),
#     stage 8 exercises 1-3 (a Hopper GPU: which gradients each break fails), and the break-it
#     exercises of stages 0-3 and 6 (stage 0 ex. 4, stage 1 ex. 5, stage 2 ex. 4, stage 3 ex. 4, stage 6
#     ex. 3 and 4: the runs each asks for and the self-test): rows of
#     stageN_*/measured/<gpu>_answers.csv, as below;
#   - the answers of stages 6 and 7 measured on older kernels (stage 6 exercises 1, 2 and 6; stage 7
#     exercises 2 to 7): the exact commands each exercise asks the learner to run, written as rows
#     of stage6_hopper/measured/<gpu>_answers.csv and stage7_backward/measured/<gpu>_answers.csv
#     (<gpu> as plots/plots.mk names it: h200 for the reference GPU), from which
#     `python3 plots/answers.py` (run by `make tables`) writes each answer's table into its lesson.
# Each experiment builds the stage as the exercise says (an edit of a copy of the repository, never
# the checkout); the builds run side by side first, then the timed runs one at a time (--check 0:
# no float64 reference beside a timing), then the self-tests (CPU-bound: the float64 reference)
# side by side. Each run has its own timeout. Over 9 minutes on an H200 with 16 cores: ONLY (below)
# splits it into runs that fit a shorter session.
# usage: common/tests/measure_answers.sh          (on a GPU)
#        ONLY="s0e4 s8e2" common/tests/measure_answers.sh   (those answers only: the builds and runs
#        they need; their rows replace the same answers' rows of the CSVs, other rows are kept)
set -u
cd "$(dirname "$0")/../.."
export PATH=/usr/local/cuda/bin:$PATH
root=$(pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '.')
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
[ -n "$cc" ] || { echo "measure_answers.sh: no NVIDIA GPU here"; exit 2; }
slug=$(printf '%s' "$gpu" | tr 'A-Z' 'a-z' | sed -e 's/[^a-z0-9][^a-z0-9]*/-/g' -e 's/^-//' -e 's/-$//' -e 's/^nvidia-//')
case $slug in h200*) slug=h200 ;; esac # the reference GPU's folder, as plots/h200/
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}  # COMMIT=: where the copy has no history of its own
jobs=$(nproc 2>/dev/null || echo 4)
echo "GPU: $gpu (sm_$cc), $(nvcc --version | grep -o 'release [0-9.]*'), commit $commit" >"$tmp/summary.000"
FA2="--batch 4 --heads 16 --seq 4096 --dim 128"
hopper=; [ "$cc" = 90 ] && hopper=1
header=answer,label,command,rc,ms_median,tflops,status,self_test,note,gpu,commit
seq=0
# want ANSWER...: whether this run measures any of these answers (all of them without ONLY)
want() {
  [ -z "${ONLY:-}" ] && return 0
  local a
  for a in "$@"; do case " $ONLY " in *" $a "*) return 0 ;; esac; done
  return 1
}

# prepare NAME STAGE_DIR FILE SED_SCRIPT [ARCH]: starts, in the background, a copy of the
# repository with STAGE_DIR/FILE edited by SED_SCRIPT ("" = as it is), built for ARCH (default this
# GPU) into $tmp/NAME/build
prepare() {
  local name=$1 dir=$2 file=$3 edit=$4 arch=${5:-$cc} t=$tmp/$1
  mkdir -p "$t/src"
  (cd "$root" && tar --exclude=./build --exclude='./build-*' --exclude=./labs --exclude=./.git -cf - .) | tar -xf - -C "$t/src"
  if [ -n "$edit" ]; then
    sed -i "$edit" "$t/src/$dir/$file"
    if cmp -s "$t/src/$dir/$file" "$root/$dir/$file"; then
      echo "the edit '$edit' changed nothing in $dir/$file (the exercise's line moved?)" >"$t/why"
      return
    fi
  fi
  (timeout 600 make --no-print-directory -C "$t/src" BUILD="$t/build" ARCH="$arch" "$t/build/$dir" >"$t/build.log" 2>&1 ||
     echo "the build failed (last line: $(tail -n 1 "$t/build.log"))" >"$t/why") &
}

# ready NAME STAGE_DIR: (after the builds) sets $p, the program, or says why not and fails
ready() {
  p=$tmp/$1/build/$2
  [ -d "$tmp/$1" ] || return 1  # not wanted in this run (ONLY)
  if [ -s "$tmp/$1/why" ] || [ ! -x "$p" ]; then
    seq=$((seq + 1))
    echo "$1: NOT RUN: $(cat "$tmp/$1/why" 2>/dev/null || echo 'no program built')" | tee "$tmp/summary.$(printf %03d $seq)"
    return 1
  fi
}

# measure ANSWER LABEL SECONDS PROGRAM ARGS...: one run under a timeout; its median time (with
# --csv), or its exit code and last line, into the summary, and (ANSWER not "-") a row of the
# answers' CSV. NOTE, if set, goes into the row's note; CMD, if set, is the row's command.
measure() {
  local answer=$1 label=$2 secs=$3; shift 3
  local out err rc ms st line n
  seq=$((seq + 1)); n=$(printf %03d $seq)
  out=$(timeout "$secs" "$@" 2>"$tmp/err.$n"); rc=$?
  err=$(tail -n 1 "$tmp/err.$n")
  ms=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next } ("ms_median" in c) && $c["ms_median"] != "" { print $c["ms_median"], $c["tflops"], $c["status"]; exit }' <<<"$out")
  st=$(grep -oE '^[0-9]+ passed, [0-9]+ failed' <<<"$out" | tail -n 1)
  line="$label: exit $rc"
  [ "$rc" -eq 124 ] && line="$label: did not finish in $secs s"
  [ -n "$ms" ] && line="$line, $(awk '{printf "%s ms median, %s TFLOP/s, %s", $1, $2, $3}' <<<"$ms")"
  [ -n "$st" ] && line="$line, self-test $st"
  [ "$rc" -ne 0 ] && [ -n "$err" ] && line="$line; stderr: $err"
  echo "$line" | tee "$tmp/summary.$n"
  if [ "$answer" != - ]; then
    local cmd ms_ tf_ status_
    read -r ms_ tf_ status_ <<<"$ms"
    # the program as the learner names it: build/<stage>
    cmd=${CMD:-$(printf '%s' "$*" | sed -E -e "s|$tmp/s7t4/build/|build/t4/|" -e "s|$tmp/[a-z0-9]+/build/|build/|")}
    printf '%s\n' "$answer" "$label" "$cmd" "$rc" "${ms_:--}" "${tf_:--}" "${status_:--}" "${st:--}" "${NOTE:--}" "$gpu" "$commit" |
      sed -e 's/"/""/g' -e 's/.*/"&"/' | paste -sd, >"$tmp/row.$n"
  fi
}

# in the background, for the self-tests (CPU-bound: side by side)
measure_bg() { seq=$((seq + 1)); local s=$seq; (seq=$((s - 1)); measure "$@" >/dev/null) & seq=$s; }

# ---- the builds, side by side
want s1e4 && prepare s1 stage1_scalar_flash attention.cu ""
want s1e4 && prepare s1noskip stage1_scalar_flash attention.cu 's|const int last_row = min(q0 + BR, N) - 1;|const int last_row = N - 1;|'
want s2e3 && prepare s2 stage2_smem_tiling attention.cu ""
want s2e3 && prepare s2pad16 stage2_smem_tiling attention.cu 's|^constexpr int Q_PAD = 8;|constexpr int Q_PAD = 16;|'
want s2e3 && prepare s2pad4 stage2_smem_tiling attention.cu 's|^constexpr int Q_PAD = 8;|constexpr int Q_PAD = 4;|'
want s3e3 && prepare s3 stage3_cp_async attention.cu ""
[ -n "$hopper" ] && want s6e1 s6e2 s6e5 s6e6 && prepare s6 stage6_hopper attention.cu ""
want s7e2 s7e3 s7e4 s7e7 && prepare s7 stage7_backward attention.cu ""
# stage 7 exercise 4: PTX for the T4 (compute_75), run here by the driver's JIT
want s7e4 && prepare s7t4 stage7_backward attention.cu "" compute_75
# stage 7 exercise 5: the barrier after store_score_gradients() in backward_registers_kernel() deleted
want s7e5 && prepare s7nobar stage7_backward registers_kernel.cuh '/__syncthreads();  \/\/ dS_smem written by every warp, visible to all/d'
# stage 7 exercise 6: no mask in probabilities_t()
want s7e6 && prepare s7nomask stage7_backward registers_kernel.cuh 's|const bool off = mask && (|const bool off = false \&\& (|'
# the break-it exercises of stages 0-3 and 6: stage 0 ex. 4 (the mask off by one), stage 1 ex. 5
# (no rescale), stage 2 ex. 4 (no tail mask), stage 3 ex. 4 (the prefetch loads tile j again), stage 6
# ex. 3 (no wait for S) and ex. 4 (no wait for K)
want s0e4 && prepare s0mask stage0_naive attention.cu 's|const int n_keys = causal ? i + 1 : N;  // keys this row|const int n_keys = causal ? i : N;  // keys this row|'
want s1e5 && prepare s1alpha stage1_scalar_flash attention.cu 's|const float alpha = expf(m_i - m_ref);|const float alpha = 1.f;|'
want s2e4 && prepare s2tail stage2_smem_tiling attention.cu 's|(kj >= N \|\| (causal \&\& kj > i))|(causal \&\& kj > i)|'
want s3e4 && prepare s3pre stage3_cp_async attention.cu 's|load_tile_async<BC, D, D, BR>(\([KV]\)_next, \([KV]\), k0 + BC, N, tid);|load_tile_async<BC, D, D, BR>(\1_next, \2, k0, N, tid);|'
if [ -n "$hopper" ]; then
  want s6e3 && prepare s6nowaits stage6_hopper mainloop.cuh '/^        wgmma_wait<1>();  \/\/ S of the next key tile is done; P V may still run$/d'
  want s6e4 && prepare s6nowaitk stage6_hopper mainloop.cuh '/^    wait_full(sm, BAR_K_FULL, kv_next);$/d'
fi
# stage 8 (Hopper only), exercise 1: the dQ product's A operand not transposed; exercise 2: no
# wait for dS^T before the dQ product; exercise 3: no mask in probabilities()
if [ -n "$hopper" ]; then
  want s8e1 && prepare s8ta stage8_hopper_backward mainloop.cuh 's|wgmma_m64n64_ss<BF16, 1, 1>(dQ_part|wgmma_m64n64_ss<BF16, 0, 1>(dQ_part|'
  want s8e2 && prepare s8nobar stage8_hopper_backward mainloop.cuh '/^        wait_ds(sm, dq.it);$/d'
  want s8e3 && prepare s8nomask stage8_hopper_backward mainloop.cuh 's|^            if (mask) {|            if (false) {|'
fi
wait

# ---- the timed runs, one at a time
# stage 1, exercise 4: the causal skip (last_row = N - 1: every key tile visited)
if ready s1 stage1_scalar_flash; then
  measure s1e4 "default, fa2 shape" 300 "$p" $FA2 --bench --csv --check 0
  measure s1e4 "default, fa2 shape, causal" 300 "$p" $FA2 --causal --bench --csv --check 0
fi
ready s1noskip stage1_scalar_flash && s1noskip=$p &&
  measure s1e4 "last_row = N - 1, fa2 shape, causal" 300 "$p" $FA2 --causal --bench --csv --check 0
# stage 2, exercise 3: Q_PAD = 16 and 4
if ready s2 stage2_smem_tiling; then
  measure s2e3 "default (Q_PAD = 8), fa2 shape" 300 "$p" $FA2 --bench --csv --check 0
  measure s2e3 "nopad, fa2 shape" 300 "$p" $FA2 --bench --csv --check 0 --variant nopad
fi
if ready s2pad16 stage2_smem_tiling; then
  s2pad16=$p
  measure s2e3 "Q_PAD = 16, fa2 shape" 300 "$p" $FA2 --bench --csv --check 0
  measure s2e3 "Q_PAD = 16, fa2 shape, --smem-limit 65536" 300 "$p" $FA2 --bench --csv --check 0 --smem-limit 65536
fi
ready s2pad4 stage2_smem_tiling && measure s2e3 "Q_PAD = 4, fa2 shape" 300 "$p" $FA2 --bench --csv --check 0
# stage 3, exercise 3: double buffering's shared memory
if ready s3 stage3_cp_async; then
  for lim in "" 65536 50000; do
    for v in default sync; do
      measure s3e3 "$v, fa2 shape${lim:+, --smem-limit $lim}" 300 "$p" $FA2 --bench --csv --check 0 --variant $v ${lim:+--smem-limit $lim}
    done
  done
fi

# stage 6 (Hopper only): exercise 5, --smem-limit picks no other layout; exercises 1, 2 and 6
if [ -n "$hopper" ] && ready s6 stage6_hopper; then
  measure s6e5 "default, B = H = 1, N = 1,024, D = 128" 120 "$p" --seq 1024 --dim 128 --bench --csv --check 0
  measure s6e5 "--smem-limit 200000, B = H = 1, N = 1,024, D = 128" 120 "$p" --seq 1024 --dim 128 --bench --csv --check 0 --smem-limit 200000
  measure s6e5 "--smem-limit 100000, B = H = 1, N = 1,024, D = 128" 120 "$p" --seq 1024 --dim 128 --bench --csv --check 0 --smem-limit 100000
  for v in nooverlap nopingpong default; do
    measure s6e1 "$v, B = 1, H = 16, N = 16,384, D = 128" 120 "$p" --batch 1 --heads 16 --seq 16384 --dim 128 --bench --csv --check 0 --variant $v
  done
  for d in 128 64; do
    for v in default nopersistent; do
      measure s6e2 "$v, B = 16, H = 16, N = 1,024, D = $d, causal" 120 "$p" --batch 16 --heads 16 --seq 1024 --dim $d --causal --bench --csv --check 0 --variant $v
    done
  done
  for shape in "--seq 4096 --dim 128" "--seq 16384 --dim 128 --causal" "--seq 1024 --dim 128"; do
    for v in default nosplit; do
      label="$v, B = H = 1, N = $(sed -E 's/.*--seq ([0-9]+).*/\1/' <<<"$shape"), D = 128$(grep -q causal <<<"$shape" && echo ', causal')"
      measure s6e6 "$label" 120 "$p" $shape --bench --csv --check 0 --variant $v
    done
  done
elif [ -z "$hopper" ]; then
  seq=$((seq + 1)); echo "stage 6 exercises 1, 2, 5, 6: not run: sm_$cc is not Hopper" >"$tmp/summary.$(printf %03d $seq)"
fi

# stage 7: exercises 2 (two layouts), 3 (determinism), 4 (the T4 path), 7 (atomics or the TMA unit)
S7A="--batch 1 --heads 16 --seq 16384 --dim 128"
S7B="--batch 1 --heads 32 --seq 16384 --dim 64"
if ready s7 stage7_backward; then
  s7=$p
  for shape in "$S7A" "$S7B"; do
    label="B = 1, H = $(awk '{print $4}' <<<"$shape"), N = 16,384, D = $(awk '{print $8}' <<<"$shape")"
    for v in default registers; do measure s7e2 "$v, $label" 180 "$p" $shape --bench --csv --check 0 --variant $v; done
    for v in default deterministic; do measure s7e3 "$v, $label" 180 "$p" $shape --bench --csv --check 0 --variant $v; done
  done
  # exercise 3's second part: two runs of one shape, their dQ and dK files compared
  for v in default deterministic; do
    rcs=0
    for r in a b; do
      (cd "$tmp" && timeout 120 "$p" --batch 2 --heads 8 --seq 3000 --dim 128 --causal --variant $v --dq "dq_$v$r.npy" --dk "dk_$v$r.npy" >/dev/null 2>&1)
      rc=$?; [ "$rc" -gt "$rcs" ] && rcs=$rc
    done
    for g in dq dk; do
      if [ -s "$tmp/${g}_${v}a.npy" ] && [ -s "$tmp/${g}_${v}b.npy" ]; then
        n=$(cmp -l "$tmp/${g}_${v}a.npy" "$tmp/${g}_${v}b.npy" 2>/dev/null | wc -l)
        case $n in 0) what="identical" ;; 1) what="1 byte differs" ;; *) what="$n bytes differ" ;; esac
      else
        what="not written"
      fi
      CMD="build/stage7_backward --batch 2 --heads 8 --seq 3000 --dim 128 --causal --variant $v --dq dq_${v}{a,b}.npy --dk dk_${v}{a,b}.npy" \
        NOTE="two runs: ${g} files $what" measure s7e3 "$v, B = 2, H = 8, N = 3,000, D = 128, causal: two runs' $g compared" 120 bash -c "exit $rcs"
    done
  done
  # exercise 4: --smem-limit 65536 on the native build
  measure s7e4 "native (sm_$cc), --smem-limit 65536, B = 1, H = 16, N = 16,384, D = 128" 180 "$p" $S7A --bench --csv --check 0 --smem-limit 65536
  # exercise 7 (Hopper): dQ by the warps' atomics against the TMA unit's reductions
  if [ -n "$hopper" ]; then
    for v in default atomics; do
      measure s7e7 "$v, B = 1, H = 16, N = 16,384, D = 128" 180 "$p" $S7A --bench --csv --check 0 --variant $v
    done
  fi
fi
if ready s7t4 stage7_backward; then
  s7t4=$p
  measure s7e4 "compute_75 PTX, --smem-limit 65536, B = 1, H = 16, N = 16,384, D = 128" 300 "$p" $S7A --bench --csv --check 0 --smem-limit 65536
fi

# stage 8 (Hopper only), exercises 1 and 3: which gradients the checker finds past their bounds
# (over_bound reads the checker's line: "dQ 3.6e-04 (bound 8.9e-04), dK ...")
over_bound() {
  awk '{ for (i = 1; i < NF - 2; i++) if ($i ~ /^(max_abs_err|dQ|dK|dV)$/) { b = $(i + 3); gsub(/[(),]/, "", b)
         if ($(i + 1) + 0 > b + 0) s = s " " ($i == "max_abs_err" ? "O" : $i) } }
       END { print (s == "" ? "none" : substr(s, 2)) }'
}
# check8 ANSWER LABEL PROGRAM ARGS...: one checked run, the gradients past their bounds as its note
check8() {
  local answer=$1 label=$2 prog=$3 out rc; shift 3
  timeout 120 "$prog" "$@" >"$tmp/check8.out" 2>&1; rc=$?
  out=$(tail -n 1 "$tmp/check8.out")
  CMD="build/stage8_hopper_backward $*" NOTE="past the bound: $(over_bound <<<"$out")" \
    measure "$answer" "$label" 120 bash -c "exit $rc"
}
if [ -n "$hopper" ]; then
  ready s8ta stage8_hopper_backward &&
    check8 s8e1 "issue_dq() with A not transposed, N = 256, D = 128" "$p" --seq 256 --dim 128
  if ready s8nomask stage8_hopper_backward; then
    check8 s8e3 "probabilities() without the mask, N = 1,000, D = 64, peaky" "$p" --seq 1000 --dim 64 --dist peaky
    check8 s8e3 "probabilities() without the mask, N = 1,000, D = 64, peaky, causal" "$p" --seq 1000 --dim 64 --dist peaky --causal
  fi
  ready s8nobar stage8_hopper_backward && s8nobar=$p
fi

# the break-it exercises: the runs each asks for (exit code, the checker's verdict), then (below)
# the self-test beside the others
if ready s0mask stage0_naive; then
  s0mask=$p
  for v in default cublas; do
    for c in "" --causal; do
      measure s0e4 "$v, N = 1,024, D = 128${c:+, causal}" 120 "$p" --seq 1024 --dim 128 $c --variant $v
    done
  done
fi
if ready s1alpha stage1_scalar_flash; then
  s1alpha=$p
  for n in 16 4096; do measure s1e5 "alpha = 1, N = $n, D = 128" 120 "$p" --seq $n --dim 128; done
fi
if ready s2tail stage2_smem_tiling; then
  s2tail=$p
  for a in "--seq 4096 --dim 128" "--seq 17 --dim 128" "--seq 17 --dim 128 --causal"; do
    measure s2e4 "no tail mask, $a" 120 "$p" $a
  done
fi
if ready s3pre stage3_cp_async; then
  s3pre=$p
  for a in "--seq 32 --dim 128" "--seq 4096 --dim 128" "--seq 4096 --dim 128 --variant sync"; do
    measure s3e4 "prefetch of tile j, $a" 120 "$p" $a
  done
fi
if [ -n "$hopper" ]; then
  # exercise 3's build: ptxas's C7515 (wgmma serialized) in its report, and whether the build
  # stops there (the course's builds make warnings errors)
  want s6e3 && {
  n=$(grep -c C7515 "$tmp/s6nowaits/build/ptxas/stage6_hopper.txt" 2>/dev/null) || n=0
  [ -s "$tmp/s6nowaits/why" ] && b=1 || b=0
  CMD="make build (mainloop.cuh without the wait for S); grep C7515 build/ptxas/stage6_hopper.txt" \
    NOTE="ptxas C7515 lines: $n; the build $([ $b = 1 ] && echo 'stops (warnings are errors)' || echo succeeds)" \
    measure s6e3 "no wgmma_wait<1>() for S: the build" 10 bash -c "exit $b"
  }
  ready s6nowaits stage6_hopper && s6nowaits=$p
  ready s6nowaitk stage6_hopper && s6nowaitk=$p
fi

# ---- the self-tests, side by side (CPU-bound)
ready s7nobar stage7_backward && s7nobar=$p
ready s7nomask stage7_backward && s7nomask=$p
[ -n "${s1noskip:-}" ] && measure_bg s1e4 "last_row = N - 1, --self-test" 600 "$s1noskip" --self-test
[ -n "${s2pad16:-}" ] && measure_bg s2e3 "Q_PAD = 16, --self-test" 600 "$s2pad16" --self-test
[ -n "${s7t4:-}" ] && measure_bg s7e4 "compute_75 PTX, --self-test --smem-limit 65536" 600 "$s7t4" --self-test --smem-limit 65536
[ -n "${s7nobar:-}" ] && measure_bg s7e5 "backward_registers_kernel() without the barrier after store_score_gradients(), --self-test --variant registers" 600 "$s7nobar" --self-test --variant registers
[ -n "${s7nomask:-}" ] && measure_bg s7e6 "probabilities_t() without the mask, --self-test --variant registers" 600 "$s7nomask" --self-test --variant registers
wait
# the break-it exercises' self-tests and stage 8's (after the ones above: at most seven side by side)
[ -n "${s8nobar:-}" ] && measure_bg s8e2 "consumer_step() without wait_ds(), --self-test" 600 "$s8nobar" --self-test
[ -n "${s8nobar:-}" ] && measure_bg s8e2 "consumer_step() without wait_ds(), racecheck (exit 9: a hazard reported)" 300 compute-sanitizer --tool racecheck --error-exitcode 9 "$s8nobar" --heads 4 --seq 700 --dim 64
[ -n "${s0mask:-}" ] && measure_bg s0e4 "mask off by one, --self-test" 600 "$s0mask" --self-test
[ -n "${s1alpha:-}" ] && measure_bg s1e5 "alpha = 1, --self-test" 600 "$s1alpha" --self-test
[ -n "${s2tail:-}" ] && measure_bg s2e4 "no tail mask, --self-test" 600 "$s2tail" --self-test
[ -n "${s3pre:-}" ] && measure_bg s3e4 "prefetch of tile j, --self-test" 600 "$s3pre" --self-test
[ -n "${s6nowaits:-}" ] && measure_bg s6e3 "no wgmma_wait<1>() for S, --self-test --variant default" 600 "$s6nowaits" --self-test --variant default
[ -n "${s6nowaitk:-}" ] && measure_bg s6e4 "no wait for K in issue_turn(), --self-test --variant default" 600 "$s6nowaitk" --self-test --variant default
wait

# ---- the answers' CSVs, the summary
for s in 0:stage0_naive 1:stage1_scalar_flash 2:stage2_smem_tiling 3:stage3_cp_async 6:stage6_hopper 7:stage7_backward 8:stage8_hopper_backward; do
  rows=$(cat "$tmp"/row.* 2>/dev/null | grep "^\"s${s%%:*}e" || true)
  [ -n "$rows" ] || continue
  out=${s#*:}/measured/${slug}_answers.csv
  mkdir -p "${out%/*}"
  kept=
  if [ -n "${ONLY:-}" ] && [ -f "$out" ]; then  # the rows of answers this run did not measure
    kept=$(tail -n +2 "$out" | while IFS= read -r r; do a=${r%%,*}; want "${a//\"/}" || printf '%s\n' "$r"; done)
  fi
  { echo "$header"; [ -n "$kept" ] && printf '%s\n' "$kept"; printf '%s\n' "$rows"; } >"$out"
  echo "measure_answers.sh: wrote $out ($(printf '%s\n' "$rows" | wc -l) rows); python3 plots/answers.py writes them into the lessons"
done
echo
echo "== summary (measured on $gpu)"
cat "$tmp"/summary.*
