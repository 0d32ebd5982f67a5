#!/bin/bash
# The backward's comparison run on a GPU with PyTorch: compute-sanitizer on stage 7's kernels,
# then stage 7 and SDPA's FLASH_ATTENTION (FA2) and CUDNN_ATTENTION backward on the 20 fa2 shapes
# with N >= 1024, one protocol for all (CUDA events around each call, L2 flushed before each,
# median of >= 10 calls and 0.5 s); prints the table of TFLOP/s and time ratios.
#   OUT=dir bash tools/compare_bwd.sh      (STAGE7=path of the program; SANITIZE=0 skips the
#   sanitizers)
cd "$(dirname "$0")/.."
OUT=${OUT:-build/compare}; mkdir -p "$OUT"; export OUT
nvidia-smi -L
B=${STAGE7:-build/stage7_backward}
echo "== sanitize"
[ "${SANITIZE:-1}" = 0 ] && echo "skipped (SANITIZE=0)" || for t in memcheck racecheck synccheck; do
  for v in default deterministic; do
    for a in "--batch 2 --heads 3 --seq 300 --dim 64 --causal" "--batch 2 --heads 3 --seq 200 --dim 128"; do
      timeout 120 compute-sanitizer --tool $t --error-exitcode 9 $B $a --variant $v --check 4 > $OUT/san.txt 2>&1; rc=$?
      echo "$t $v $a: rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san.txt | tail -1)"
    done
  done
done
echo "== stage 7 on the fa2 shapes"
echo "variant,B,H,N,D,causal,bwd_ms,bwd_tflops,both_ms" > $OUT/s7.csv
for D in 64 128; do for c in 0 1; do for N in 1024 2048 4096 8192 16384; do
  Bt=$((16384 / N)); H=$((2048 / D)); cf=""; [ $c = 1 ] && cf=--causal
  for v in default deterministic; do
    timeout 60 $B --batch $Bt --heads $H --seq $N --dim $D $cf --variant $v --bench --csv --check 4 2>/dev/null | awk -F, -v v=$v -v c=$c 'NR>1 { if ($4=="bwd") { m=$11; t=$14 } else b=$11 } END { print v "," $5 "," $6 "," $7 "," $8 "," c "," m "," t "," b }' >> $OUT/s7.csv
  done
done; done; done
echo "== sdpa"
timeout 200 python3 -m tools.sdpa_bwd > $OUT/sdpa.csv 2>$OUT/sdpa.err; tail -3 $OUT/sdpa.err
python3 - <<'PY'
import csv, os, math
from plots import measure  # the FLOP count: one home
O = os.environ["OUT"]
s7 = {(r["variant"], r["N"], r["D"], r["causal"]): float(r["bwd_ms"]) for r in csv.DictReader(open(O + "/s7.csv")) if r["bwd_ms"]}
sd = {}
for r in csv.DictReader(open(O + "/sdpa.csv")):
    if r["bwd_ms"]: sd[(r["backend"], r["N"], r["D"], r["causal"])] = float(r["bwd_ms"])
print("shape                 s7 TF   det TF  FA2 TF  cuDNN TF  s7/FA2  det/FA2  s7/cuDNN")
rat = []; ratd = []; ratc = []
for D in ("64", "128"):
  for c in ("0", "1"):
    for N in ("1024", "2048", "4096", "8192", "16384"):
      B, H = 16384 // int(N), 2048 // int(D)
      fl = measure.flops(B, H, int(N), int(D), c == "1", "bwd") / 1e9
      a = s7.get(("default", N, D, c)); d = s7.get(("deterministic", N, D, c))
      f = sd.get(("sdpa_flash", N, D, c)); u = sd.get(("sdpa_cudnn", N, D, c))
      if not (a and f and u and d): print(N, D, c, "missing"); continue
      rat.append(f / a); ratd.append(f / d); ratc.append(u / a)
      print(f"D={D} N={N:>5} c={c}   {fl/a:6.1f}  {fl/d:6.1f}  {fl/f:6.1f}  {fl/u:7.1f}   {f/a:.3f}   {f/d:.3f}   {u/a:.3f}")
g = lambda x: math.exp(sum(map(math.log, x)) / len(x))
print(f"geomean stage7/FA2 {g(rat):.3f} (min {min(rat):.3f}); deterministic/FA2 {g(ratd):.3f} (min {min(ratd):.3f}); stage7/cuDNN {g(ratc):.3f}")
PY
