#!/usr/bin/env bash
# The lessons' exercise answers that are still predictions where a measurement is possible, measured
# in one GPU session: each experiment builds the stage as the exercise says (an edit of a copy of
# the repository, never the checkout), runs under its own timeout, and adds a line to the summary
# printed last (the command, the exit code, the median time or the message). Answers to write from
# it, with the GPU named: stage 1 exercise 4 (the causal skip), stage 2 exercise 3 (other
# paddings), stage 3 exercise 3 (double buffering's shared memory), stage 6 exercise 5
# (--smem-limit picks no other layout).
# usage: common/tests/measure_answers.sh          (on a GPU; about 10 minutes on an H200)
set -u
cd "$(dirname "$0")/../.."
export PATH=/usr/local/cuda/bin:$PATH
root=$(pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '.')
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
[ -n "$cc" ] || { echo "measure_answers.sh: no NVIDIA GPU here"; exit 2; }
summary=("GPU: $gpu (sm_$cc), $(nvcc --version | grep -o 'release [0-9.]*'), commit $(git rev-parse --short HEAD 2>/dev/null)")
FA2="--batch 4 --heads 16 --seq 4096 --dim 128"

# variant NAME STAGE_DIR SED_SCRIPT: a copy of the repository with the stage's attention.cu edited
# by SED_SCRIPT ("" = as it is), built for this GPU into $tmp/NAME/build; sets $p, its program
variant() {
  local name=$1 dir=$2 edit=$3 t=$tmp/$1
  mkdir -p "$t/src"
  (cd "$root" && tar --exclude=./build --exclude='./build-*' --exclude=./labs --exclude=./.git -cf - .) | tar -xf - -C "$t/src"
  if [ -n "$edit" ]; then
    sed -i "$edit" "$t/src/$dir/attention.cu"
    if cmp -s "$t/src/$dir/attention.cu" "$root/$dir/attention.cu"; then
      echo "measure_answers.sh: $name: the edit '$edit' changed nothing in $dir/attention.cu" >&2
      summary+=("$name: NOT RUN: the edit matched nothing (the exercise's line moved?)")
      return 1
    fi
  fi
  if ! timeout 600 make --no-print-directory -C "$t/src" BUILD="$t/build" ARCH="$cc" "$t/build/$dir" >"$t/build.log" 2>&1; then
    summary+=("$name: NOT RUN: the build failed (last line: $(tail -n 1 "$t/build.log"))")
    return 1
  fi
  p=$t/build/$dir
}

# measure LABEL SECONDS PROGRAM ARGS...: one run under a timeout; its median time (with --csv),
# or its exit code and last line, into the summary
measure() {
  local label=$1 secs=$2; shift 2
  local out err rc ms
  out=$(timeout "$secs" "$@" 2>"$tmp/err"); rc=$?
  err=$(tail -n 1 "$tmp/err")
  ms=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next } ("ms_median" in c) && $c["ms_median"] != "" { print $c["ms_median"], $c["tflops"], $c["status"]; exit }' <<<"$out")
  local line="$label: exit $rc"
  [ "$rc" -eq 124 ] && line="$label: did not finish in $secs s"
  [ -n "$ms" ] && line="$line, $(awk '{printf "%s ms median, %s TFLOP/s, %s", $1, $2, $3}' <<<"$ms")"
  grep -qE '^[0-9]+ passed, [0-9]+ failed' <<<"$out" && line="$line, self-test $(grep -oE '^[0-9]+ passed, [0-9]+ failed' <<<"$out" | tail -n 1)"
  [ "$rc" -ne 0 ] && [ -n "$err" ] && line="$line; stderr: $err"
  echo "$line"
  summary+=("$line")
}

# ---- stage 1, exercise 4: the causal skip (last_row = N - 1: every key tile visited)
if variant s1 stage1_scalar_flash ""; then
  measure "stage 1 default, fa2 shape, non-causal" 300 "$p" $FA2 --bench --csv
  measure "stage 1 default, fa2 shape, causal" 300 "$p" $FA2 --causal --bench --csv
fi
if variant s1noskip stage1_scalar_flash 's|const int last_row = min(q0 + BR, N) - 1;|const int last_row = N - 1;|'; then
  measure "stage 1 ex4 (last_row = N - 1), fa2 shape, causal" 300 "$p" $FA2 --causal --bench --csv
  measure "stage 1 ex4 (last_row = N - 1), --self-test" 600 "$p" --self-test
fi

# ---- stage 2, exercise 3: Q_PAD = 16 and 4
if variant s2 stage2_smem_tiling ""; then
  measure "stage 2 default (Q_PAD = 8), fa2 shape" 300 "$p" $FA2 --bench --csv
  measure "stage 2 nopad, fa2 shape" 300 "$p" $FA2 --bench --csv --variant nopad
fi
if variant s2pad16 stage2_smem_tiling 's|^constexpr int Q_PAD = 8;|constexpr int Q_PAD = 16;|'; then
  measure "stage 2 ex3 Q_PAD = 16, fa2 shape" 300 "$p" $FA2 --bench --csv
  measure "stage 2 ex3 Q_PAD = 16, fa2 shape, --smem-limit 65536" 300 "$p" $FA2 --bench --csv --smem-limit 65536
  measure "stage 2 ex3 Q_PAD = 16, --self-test" 600 "$p" --self-test
fi
if variant s2pad4 stage2_smem_tiling 's|^constexpr int Q_PAD = 8;|constexpr int Q_PAD = 4;|'; then
  measure "stage 2 ex3 Q_PAD = 4, fa2 shape" 300 "$p" $FA2 --bench --csv
fi

# ---- stage 3, exercise 3: double buffering's shared memory
if variant s3 stage3_cp_async ""; then
  for lim in "" 65536 50000; do
    for v in default sync; do
      measure "stage 3 $v, fa2 shape${lim:+, --smem-limit $lim}" 300 "$p" $FA2 --bench --csv --variant $v ${lim:+--smem-limit $lim}
    done
  done
fi

# ---- stage 6, exercise 5: --smem-limit picks no other layout (Hopper only)
if [ "$cc" = 90 ]; then
  if variant s6 stage6_hopper ""; then
    measure "stage 6 ex5, --seq 1024 --dim 128 --bench --smem-limit 200000" 120 "$p" --seq 1024 --dim 128 --bench --smem-limit 200000
  fi
else
  summary+=("stage 6 ex5: not run: sm_$cc is not Hopper")
fi

echo
echo "== summary (measured on $gpu)"
printf '%s\n' "${summary[@]}"
