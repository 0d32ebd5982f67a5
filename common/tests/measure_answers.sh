#!/usr/bin/env bash
# The lessons' exercise answers measured in one GPU session, on the kernels as they are now:
#   - stage 1 exercise 4 (the causal skip), stage 2 exercise 3 (other paddings), stage 3 exercise 3
#     (double buffering's shared memory), stage 6 exercise 5 (--smem-limit picks no other layout),
#     stage 8 exercises 1-3 (a Hopper GPU: which gradients each break fails), and the break-it
#     exercises of stages 0-3 and 6 (stage 0 ex. 4, stage 1 ex. 5, stage 2 ex. 4, stage 3 ex. 4, stage 6
#     ex. 3 and 4: the runs each asks for and the self-test): rows of
#     stageN_*/measured/<gpu>_answers.csv, as below;
#   - every exercise of stages 4 and 5 (stage 4: ncu's tensor-pipe share and instruction count beside
#     stage 5's, the L4's shared memory, the T4 path, the unrescaled sum; stage 5: the swizzle off
#     and ncu's bank conflicts, single_stage and noskip, lazy and eager rescaling, split-KV, the
#     one-sided swizzle, the T4 path), stage 6 exercise 1 at three shapes (D = 128, D = 64 with three
#     consumers, causal), and stage 8 exercise 3's self-test;
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
#        e.g. ONLY="s4e1 s4e2 s4e3 s4e4", then ONLY="s5e1 s5e2 s5e3 s5e4 s5e5 s5e6": stages 4 and 5
#        (ncu for s4e1 and s5e1: found as `make profile` finds it; without it those rows say so)
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
# GPU) into $tmp/NAME/build. (make test runs the builds section below with a prepare that checks
# each edit still changes its file: common/tests/check_answer_edits.sh.)
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
  # a run of an answer ONLY leaves out (its build serves another): neither run nor written
  [ "$answer" != - ] && ! want "$answer" && return 0
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
    cmd=${CMD:-$(printf '%s' "$*" | sed -E -e "s|$tmp/s[0-9]+t4/build/|build/t4/|" -e "s|$tmp/[a-z0-9]+/build/|build/|")}
    printf '%s\n' "$answer" "$label" "$cmd" "$rc" "${ms_:--}" "${tf_:--}" "${status_:--}" "${st:--}" "${NOTE:--}" "$gpu" "$commit" |
      sed -e 's/"/""/g' -e 's/.*/"&"/' | paste -sd, >"$tmp/row.$n"
  fi
}

# in the background, for the self-tests (CPU-bound: side by side)
measure_bg() { seq=$((seq + 1)); local s=$seq; (seq=$((s - 1)); measure "$@" >/dev/null) & seq=$s; }

# the program as the learner names it: build/<stage> (build/t4/<stage> for a compute_75 build)
learner_path() { case $1 in */s[0-9]*t4/build/*) echo "build/t4/${1##*/build/}" ;; *) echo "build/${1##*/build/}" ;; esac; }

# checked ANSWER LABEL PROGRAM ARGS...: one checked forward run, the checker's verdict (its error
# against its bound, and any NaN/Inf) as the row's note
checked() {
  local answer=$1 label=$2 prog=$3 rc verdict; shift 3
  timeout 300 "$prog" "$@" >"$tmp/checked.out" 2>&1; rc=$?
  verdict=$(grep -oE 'max_abs_err [^ ]+ \(bound [^)]+\)|[0-9]+ NaN/Inf' "$tmp/checked.out" | tail -n 2 | paste -sd ' ' -)
  CMD="$(learner_path "$prog") $*" NOTE="${verdict:-no checker line: $(tail -n 1 "$tmp/checked.out")}" \
    measure "$answer" "$label" 10 bash -c "exit $rc"
}

# ncu, for the exercises that read the profiler's counters (where `make profile` finds it)
ncu=$(command -v ncu 2>/dev/null || ls -d /usr/local/cuda/bin/ncu /usr/local/cuda/nsight-compute*/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -n 1)
TENSOR=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
INSTRUCTIONS=sm__inst_executed.sum
CONFLICTS=l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
DURATION=gpu__time_duration.sum
# profile ANSWER LABEL METRICS PROGRAM ARGS...: the stage's attention kernel under ncu (its second
# launch: `--bench` runs it many times; --clock-control none: the clocks a run has), the metrics as
# the row's note
profile() {
  local answer=$1 label=$2 metrics=$3 prog=$4 rc note opts; shift 4
  opts="--clock-control none --kernel-name regex:attention_kernel --launch-skip 1 --launch-count 1 --metrics $metrics"
  if [ -z "$ncu" ]; then
    CMD="ncu $opts $(learner_path "$prog") $*" NOTE="ncu not found here: not measured" \
      measure "$answer" "$label" 10 bash -c "exit 127"
    return
  fi
  # shellcheck disable=SC2086  # opts: one word an option
  timeout 600 "$ncu" $opts --csv "$prog" "$@" >"$tmp/ncu.out" 2>"$tmp/ncu.err"; rc=$?
  note=$(python3 - "$tmp/ncu.out" <<'EOF'
import csv, sys
names = {"sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor pipe active",
         "sm__inst_executed.sum": "warp instructions executed",
         "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": "shared-load bank conflicts",
         "gpu__time_duration.sum": "duration"}
with open(sys.argv[1], newline="") as f:
    rows = list(csv.reader(line for line in f if not line.startswith("==")))
head = next((r for r in rows if "Metric Name" in r and "Metric Value" in r), None)
out = []
if head:
    i, u, v = head.index("Metric Name"), head.index("Metric Unit"), head.index("Metric Value")
    for r in rows:
        if len(r) == len(head) and r is not head and r[i] in names:
            out.append(f"{names[r[i]]} {r[v]} {r[u]}".strip())
print("; ".join(out))
EOF
)
  [ "$rc" -ne 0 ] || [ -z "$note" ] && note="${note:+$note; }ncu exit $rc: $(tail -n 1 "$tmp/ncu.err" 2>/dev/null)"
  CMD="ncu $opts $(learner_path "$prog") $*" NOTE="$note" measure "$answer" "$label" 10 bash -c "exit $rc"
}

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
# stages 4 and 5: the builds as they are (native, and compute_75 PTX for the T4 paths); stage 4
# exercise 4: the running sum not rescaled; stage 5 exercise 5: K read unswizzled in k_lane_offset()
want s4e1 s4e2 s4e3 && prepare s4 stage4_wmma attention.cu ""
want s4e3 && prepare s4t4 stage4_wmma attention.cu "" compute_75
want s4e4 && prepare s4sum stage4_wmma attention.cu 's|l_i = l_i \* alpha + l_new;|l_i = l_i + l_new;|'
want s4e1 s5e1 s5e2 s5e3 s5e4 s5e5 s5e6 && prepare s5 stage5_tuned attention.cu ""
want s5e6 && prepare s5t4 stage5_tuned attention.cu "" compute_75
want s5e5 && prepare s5ksw stage5_tuned attention.cu '/k_lane_offset() {/,/^}/ s|const uint32_t sw = SWIZZLE ? lane % MATRIX_ROWS : 0;|const uint32_t sw = 0;|'
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
want s3e4 && prepare s3pre stage3_cp_async attention.cu 's|load_tile_async<BC, D, LD, THREADS>(\([KV]\)_next, \([KV]\), k0 + BC, N, tid);|load_tile_async<BC, D, LD, THREADS>(\1_next, \2, k0, N, tid);|'
if [ -n "$hopper" ]; then
  want s6e3 && prepare s6nowaits stage6_hopper mainloop.cuh '/^        wgmma_wait<1>();  \/\/ S of the next key tile is done; P V may still run$/d'
  want s6e4 && prepare s6nowaitk stage6_hopper mainloop.cuh '/^    wait_full(sm, BAR_K_FULL, kv_next);$/d'
fi
# stage 8 (Hopper only), exercise 1: the dQ product's A operand not transposed; exercise 2: no
# wait for dS^T before the dQ product; exercise 3: no mask in probabilities()
if [ -n "$hopper" ]; then
  want s8e1 && prepare s8ta stage8_hopper_backward mainloop.cuh 's|wgmma_ss<dq_cols<D>(), BF16, 1, 1>(dQ_part|wgmma_ss<dq_cols<D>(), BF16, 0, 1>(dQ_part|'
  want s8e2 && prepare s8nobar stage8_hopper_backward mainloop.cuh '/^        wait_ds<D>(sm, dq.it);$/d'
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

# stage 4: exercise 1 (ncu beside stage 5), 2 (an L4's shared memory), 3 (the T4 path), 4 (the
# running sum not rescaled)
if ready s4 stage4_wmma; then
  want s4e1 && profile s4e1 "stage 4, fa2 shape" "$TENSOR,$INSTRUCTIONS,$DURATION" "$p" $FA2 --bench --check 0
  if want s4e2; then
    for shape in "--batch 4 --heads 16 --seq 4096 --dim 128" "--batch 4 --heads 32 --seq 4096 --dim 64"; do
      label="B = 4, H = $(awk '{print $4}' <<<"$shape"), N = 4,096, D = $(awk '{print $8}' <<<"$shape")"
      measure s4e2 "default, $label" 300 "$p" $shape --bench --csv --check 0
      measure s4e2 "--smem-limit 101376, $label" 300 "$p" $shape --bench --csv --check 0 --smem-limit 101376
    done
  fi
  want s4e3 && measure s4e3 "default, fa2 shape" 300 "$p" $FA2 --bench --csv
fi
want s4e1 && ready s5 stage5_tuned &&
  profile s4e1 "stage 5, fa2 shape" "$TENSOR,$INSTRUCTIONS,$DURATION" "$p" $FA2 --bench --check 0
ready s4t4 stage4_wmma &&
  measure s4e3 "compute_75 PTX --smem-limit 65536, fa2 shape" 300 "$p" $FA2 --bench --csv --smem-limit 65536
if ready s4sum stage4_wmma; then
  s4sum=$p
  for a in "--seq 4096 --dim 128" "--seq 4096 --dim 128 --dist peaky" "--seq 64 --dim 128"; do
    checked s4e4 "l_i not rescaled, $a" "$p" $a
  done
fi

# stage 5: exercises 1 (the swizzle off, and ncu's bank conflicts), 2 (single_stage, noskip), 3
# (lazy and eager rescaling), 4 (split-KV), 5 (noswizzle against a one-sided swizzle), 6 (the T4
# path)
S5CAUSAL="--batch 1 --heads 16 --seq 16384 --dim 128 --causal"
if ready s5 stage5_tuned; then
  if want s5e1; then
    for v in default noswizzle; do measure s5e1 "$v, fa2 shape" 300 "$p" $FA2 --bench --csv --check 0 --variant $v; done
    for v in default noswizzle; do
      profile s5e1 "ncu: $v, fa2 shape" "$CONFLICTS,$TENSOR,$DURATION" "$p" $FA2 --bench --check 0 --variant $v
    done
  fi
  if want s5e2; then
    for v in default single_stage; do measure s5e2 "$v, fa2 shape" 300 "$p" $FA2 --bench --csv --check 0 --variant $v; done
    for v in default noskip; do
      measure s5e2 "$v, B = 1, H = 16, N = 16,384, D = 128, causal" 300 "$p" $S5CAUSAL --bench --csv --check 0 --variant $v
    done
  fi
  if want s5e3; then
    for v in default eager_rescale; do
      measure s5e3 "$v, B = H = 1, N = 262,144, D = 128" 600 "$p" --seq 262144 --dim 128 --bench --csv --check 0 --variant $v
    done
    for v in default lazy_rescale; do measure s5e3 "$v, fa2 shape" 300 "$p" $FA2 --bench --csv --check 0 --variant $v; done
  fi
  if want s5e4; then
    for v in default nosplit; do
      measure s5e4 "$v, B = H = 1, N = 4,096, D = 128" 120 "$p" --seq 4096 --dim 128 --bench --csv --check 0 --variant $v
    done
  fi
  want s5e5 && checked s5e5 "noswizzle, fa2 shape" "$p" $FA2 --variant noswizzle
  want s5e6 && measure s5e6 "default, fa2 shape" 300 "$p" $FA2 --bench --csv
fi
if ready s5ksw stage5_tuned; then
  s5ksw=$p
  checked s5e5 "k_lane_offset() without the swizzle, fa2 shape" "$p" $FA2
fi
ready s5t4 stage5_tuned &&
  measure s5e6 "compute_75 PTX --smem-limit 65536, fa2 shape" 300 "$p" $FA2 --bench --csv --smem-limit 65536

# stage 6 (Hopper only): exercise 5, --smem-limit picks no other layout; exercises 1, 2 and 6
if [ -n "$hopper" ] && ready s6 stage6_hopper; then
  measure s6e5 "default, B = H = 1, N = 1,024, D = 128" 120 "$p" --seq 1024 --dim 128 --bench --csv --check 0
  measure s6e5 "--smem-limit 200000, B = H = 1, N = 1,024, D = 128" 120 "$p" --seq 1024 --dim 128 --bench --csv --check 0 --smem-limit 200000
  measure s6e5 "--smem-limit 100000, B = H = 1, N = 1,024, D = 128" 120 "$p" --seq 1024 --dim 128 --bench --csv --check 0 --smem-limit 100000
  # exercise 1 at D = 128 (176-key tiles), D = 64 (three consumers) and causal (128-key tiles)
  for shape in "--heads 16 --dim 128" "--heads 32 --dim 64" "--heads 16 --dim 128 --causal"; do
    label="B = 1, H = $(awk '{print $2}' <<<"$shape"), N = 16,384, D = $(awk '{print $4}' <<<"$shape")$(grep -q causal <<<"$shape" && echo ', causal')"
    for v in nooverlap nopingpong default; do
      measure s6e1 "$v, $label" 120 "$p" --batch 1 $shape --seq 16384 --bench --csv --check 0 --variant $v
    done
  done
  for d in 128 64; do
    for v in default nopersistent; do
      measure s6e2 "$v, B = 16, H = 16, N = 1,024, D = $d, causal" 120 "$p" --batch 16 --heads 16 --seq 1024 --dim $d --causal --bench --csv --check 0 --variant $v
    done
  done
  for v in default nosections; do
    measure s6e2 "$v, B = 4, H = 8, N = 4,096, D = 256, causal" 120 "$p" --batch 4 --heads 8 --seq 4096 --dim 256 --causal --bench --csv --check 0 --variant $v
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
    s8nomask=$p
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
[ -n "${s4sum:-}" ] && measure_bg s4e4 "l_i not rescaled, --self-test" 600 "$s4sum" --self-test
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
# stage 5's one-sided swizzle and stage 8's maskless probabilities, each on its default variant
[ -n "${s5ksw:-}" ] && measure_bg s5e5 "k_lane_offset() without the swizzle, --self-test --variant default" 600 "$s5ksw" --self-test --variant default
[ -n "${s8nomask:-}" ] && measure_bg s8e3 "probabilities() without the mask, --self-test --variant default" 600 "$s8nomask" --self-test --variant default
wait

# ---- the answers' CSVs, the summary
for s in 0:stage0_naive 1:stage1_scalar_flash 2:stage2_smem_tiling 3:stage3_cp_async 4:stage4_wmma 5:stage5_tuned 6:stage6_hopper 7:stage7_backward 8:stage8_hopper_backward; do
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
