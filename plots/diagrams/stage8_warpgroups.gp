# stage8_warpgroups.gp: stage 8's block (stage8_hopper_backward/README.md, "The idea"): who does
# what and where each operand lives. Left: the producer warpgroup (the load, dQ and store warps);
# middle: shared memory (K_j, V_j once, the two-slot ring, dS^T, the dQ staging tile) with the
# barriers that guard it; right: the two consumer warpgroups; bottom: global
# memory.
#   gnuplot plots/diagrams/stage8_warpgroups.gp   (writes stage8_warpgroups.png beside this script)

dir = system(sprintf("dirname '%s'", ARG0))
if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
    set terminal pngcairo size 1460, 640 noenhanced font 'Sans,11'
} else {
    set terminal png size 1460, 640 noenhanced
}
set output dir . '/stage8_warpgroups.png'
unset border; unset tics; unset key
set margins 0, 0, 0, 0
set xrange [0:146]; set yrange [0:64]

REG = '#fff3d6'; SMEM = '#e5f3e0'; GMEM = '#e3ecf8'; PROD = '#f0e6f6'; RED = '#b03030'
set style arrow 1 head filled size 1.2, 20 lw 2 lc rgb '#333333'
set style arrow 2 head filled size 1.2, 20 lw 2 lc rgb RED

o = 1
# ---- the four places ----
set object o rect from 2, 20 to 36, 58 fc rgb PROD fs solid 1.0 border lc rgb '#8855aa'; o = o + 1
set object o rect from 46, 20 to 98, 58 fc rgb SMEM fs solid 1.0 border lc rgb '#55aa66'; o = o + 1
set object o rect from 108, 40 to 144, 58 fc rgb REG fs solid 1.0 border lc rgb '#bb8833'; o = o + 1
set object o rect from 108, 20 to 144, 38 fc rgb REG fs solid 1.0 border lc rgb '#bb8833'; o = o + 1
set object o rect from 2, 2 to 144, 13 fc rgb GMEM fs solid 1.0 border lc rgb '#5577aa'; o = o + 1

set label 1 'one block: a key tile K_j, V_j (128 keys) of one (batch, key/value head), walking its query tiles i' at 2, 61.5 left font 'Sans,12'

# producer warpgroup
set label 10 'producer warpgroup (setmaxnreg: 24)' at 3, 56 left font 'Sans,12'
set label 11 'load warp (one thread issues):' at 4, 51.5 left
set label 12 '  K_j, V_j once (TMA)' at 4, 48.5 left
set label 13 '  per step: wait Q_EMPTY, then' at 4, 45.5 left
set label 14 '  Q_i, dO_i by TMA; LSE_i, D_i' at 4, 42.5 left
set label 15 '  by the lanes'' cp.async' at 4, 39.5 left
set label 16 'dQ warp (one thread issues):' at 4, 35 left
set label 17 '  wait DQ_FULL, bulk reduce-add' at 4, 32 left
set label 18 '  step i''s tile into dQ_acc,' at 4, 29 left
set label 19 '  wait until read, arrive DQ_EMPTY' at 4, 26 left
set label 9 'store warp: dK_j, dV_j by TMA' at 4, 22 left

# shared memory
set label 20 'shared memory (128-byte swizzled slabs)' at 47, 56 left font 'Sans,12'
set label 21 'K_j, V_j: 128 keys, the whole walk; then dK_j, dV_j   KV_FULL' at 48, 51.5 left
set label 22 'ring slot 0: Q_i, dO_i, LSE_i, D_i     Q_FULL, DO_FULL, Q_EMPTY' at 48, 47.5 left
set label 23 'ring slot 1: the next step''s (loads while slot 0 is used)' at 48, 44.5 left
set label 24 'dS^T, 3 buffers (stmatrix): the dQ product''s A, a step late' at 48, 38.5 left tc rgb RED
set label 25 '     DS_FULL: every warp wrote it' at 48, 35.5 left tc rgb RED
set label 26 'dQ_i staging tile, fp32   DQ_FULL, DQ_EMPTY' at 48, 29.5 left tc rgb RED
set label 27 'mbarriers: a full barrier counts bytes (TMA) and arrivals,' at 48, 24.5 left font 'Sans,10'
set label 28 'an empty one the consumers'' arrivals' at 48, 22 left font 'Sans,10'

# consumers
set label 30 'consumer warpgroup 0: keys 0..63' at 109, 56 left font 'Sans,12'
set label 31 'dK_j, dV_j: fp32 registers (setmaxnreg: 240)' at 110, 52 left
set label 32 'S^T = K Q^T, dP^T = V dO^T (wgmma, SS)' at 110, 49 left
set label 33 'P^T, dS^T stay in registers: the A of' at 110, 46 left
set label 34 'dV += P^T dO, dK += dS^T Q (wgmma, RS)' at 110, 43 left
set label 35 'consumer warpgroup 1: keys 64..127' at 109, 36 left font 'Sans,12'
set label 36 'the same, on its 64 keys; both compute' at 110, 32 left
set label 37 'dQ_i = dS K_j (wgmma, SS) from dS^T' at 110, 29 left tc rgb RED
set label 38 '(D = 128: its columns; D = 64: its queries)' at 110, 26 left tc rgb RED

# global memory
set label 40 'global memory (HBM)' at 3, 11 left font 'Sans,12'
set label 41 'Q, K, V, dO (fp16 or bf16, any strides); LSE, D_i (fp32, preprocess_kernel)' at 4, 7.5 left
set label 42 'dQ_acc (fp32, then dq_convert_kernel -> dQ)' at 70, 7.5 left tc rgb RED
set label 43 'dK_j, dV_j (written once, after the walk)' at 108, 7.5 left
set label 44 'variants: atomics adds dQ_i from the consumers'' registers (no staging); deterministic orders the reductions per query tile' at 4, 4 left font 'Sans,10'

# ---- the flows ----
set arrow 1 from 41, 13.2 to 45.5, 46 as 1
set label 50 'TMA' at 42.5, 16 right font 'Sans,10'
set arrow 2 from 98.5, 50 to 107.5, 50 as 1
set label 51 'wgmma reads' at 103, 52 center font 'Sans,10'
set arrow 3 from 107.5, 33 to 98.5, 37 as 2
set label 52 'stmatrix' at 103, 38 center font 'Sans,10' tc rgb RED
set arrow 4 from 107.5, 27 to 98.5, 29.5 as 2
set label 53 'dQ_i part' at 103, 25.5 center font 'Sans,10' tc rgb RED
set arrow 5 from 85, 28 to 85, 9.5 as 2
set label 54 'bulk reduce-add' at 86, 17 left font 'Sans,10' tc rgb RED
set arrow 6 from 107.5, 22 to 98.5, 48.5 as 1
set label 55 'st.shared' at 100, 44 left font 'Sans,10'
set arrow 7 from 60, 20 to 110, 9.5 as 1
set label 56 'TMA stores' at 66, 17 left font 'Sans,10'

plot NaN notitle
