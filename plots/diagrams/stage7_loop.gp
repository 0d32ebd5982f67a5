# stage7_loop.gp: the backward's loop (stage7_backward/README.md, "The loop order").
# Left: the tile grid of one (batch, head); one block owns a key tile (a column) and walks down the
# query tiles. Right: where each operand lives during that walk (the default kernel,
# backward_kernel; the registers variant keeps P^T and dS^T in registers instead).
#   gnuplot plots/diagrams/stage7_loop.gp      (writes stage7_loop.png beside this script)

dir = system(sprintf("dirname '%s'", ARG0))
if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
    set terminal pngcairo size 1460, 640 noenhanced font 'Sans,11'
} else {
    set terminal png size 1460, 640 noenhanced
}
set output dir . '/stage7_loop.png'
unset border; unset tics; unset key
set margins 0, 0, 0, 0
set xrange [0:146]; set yrange [0:64]

BLOCK = '#f4a261'; SKIP = '#d9d9d9'; GRID = '#ffffff'
REG = '#fff3d6'; SMEM = '#e5f3e0'; GMEM = '#e3ecf8'; RED = '#b03030'
set style arrow 1 head filled size 1.2, 20 lw 2 lc rgb '#333333'
set style arrow 2 head filled size 1.2, 20 lw 2 lc rgb RED

# ---- left: the tile grid (6 key tiles x 6 query tiles), causal ----
x0 = 10; y0 = 52; c = 6  # top-left corner, tile size
J = 2                    # the block's key tile
o = 1
do for [i = 0:5] {
    do for [j = 0:5] {
        colour = j > i ? SKIP : (j == J ? BLOCK : GRID)
        set object o rect from x0 + j * c, y0 - (i + 1) * c to x0 + (j + 1) * c, y0 - i * c \
            fc rgb colour fs solid 1.0 border lc rgb '#555555' lw 1
        o = o + 1
    }
}
set label 1 'one (batch, head): query tiles i (rows) x key tiles j (columns)' at 2, 61 left font 'Sans,12'
set label 2 'K_j, V_j' at x0 + J * c + c / 2., y0 + 2 center
set label 3 'Q_i, dO_i,' at x0 - 1, y0 - 3.5 * c + 1 right
set label 4 'LSE_i, D_i' at x0 - 1, y0 - 3.5 * c - 1.5 right
set label 5 'one block = one key tile: it walks down its column (causal: from the diagonal)' at 2, y0 - 6 * c - 3 left
set label 6 'dK_j, dV_j summed down the column, in registers' at 2, y0 - 6 * c - 5.5 left
set label 7 'causal: skipped' at x0 + 4.5 * c, y0 - 0.5 * c center font 'Sans,10'
set arrow 1 from x0 + J * c + c / 2., y0 - 2 * c - 0.6 to x0 + J * c + c / 2., y0 - 6 * c + 0.6 as 1
# dQ_i: every key tile of row i adds to it
set arrow 2 from x0 + 6 * c + 0.5, y0 - 3.5 * c to x0 + 6 * c + 5, y0 - 3.5 * c as 2
set label 9 'dQ_i += dS_ij K_j' at x0 + 6 * c + 5.5, y0 - 3.5 * c + 1.2 left tc rgb RED
set label 10 'from every column' at x0 + 6 * c + 5.5, y0 - 3.5 * c - 1.3 left tc rgb RED
set label 11 '(fp32 atomics; on sm_90' at x0 + 6 * c + 5.5, y0 - 3.5 * c - 3.8 left tc rgb RED
set label 12 'a TMA reduce-add)' at x0 + 6 * c + 5.5, y0 - 3.5 * c - 6.3 left tc rgb RED

# ---- right: where the operands live ----
bx = 76; bw = 62
set object o rect from bx, 44 to bx + bw, 60 fc rgb REG fs solid 1.0 border lc rgb '#bb8833'; o = o + 1
set object o rect from bx, 24 to bx + bw, 42 fc rgb SMEM fs solid 1.0 border lc rgb '#55aa66'; o = o + 1
set object o rect from bx, 2 to bx + bw, 22 fc rgb GMEM fs solid 1.0 border lc rgb '#5577aa'; o = o + 1
set label 20 'registers (each warp: 32 of the block''s keys)' at bx + 1, 58 left font 'Sans,12'
set label 21 'dK_j, dV_j: fp32, its keys x half of D, for the whole loop' at bx + 3, 54.5 left
set label 22 'S^T -> P^T,  dP^T -> dS^T: its keys x half the query tile' at bx + 3, 51.5 left
set label 23 'dV_j += P^T dO_i,  dK_j += dS^T Q_i,  dQ_i += dS K_j  (mma.sync)' at bx + 3, 48.5 left
set label 24 'shared memory' at bx + 1, 40 left font 'Sans,12'
set label 25 'K_j, V_j: loaded once, kept for the whole loop' at bx + 3, 36.5 left
set label 26 'Q_i, dO_i, LSE_i, D_i: two buffers, the next tile by cp.async' at bx + 3, 33 left
set label 27 'P^T, dS^T [keys x queries] (fp16): every warp''s, read by all' at bx + 3, 29.5 left
set label 37 'sm_90: the dQ tile (fp32), staged for the TMA reduce-add' at bx + 3, 26 left tc rgb RED
set label 28 'global memory (HBM)' at bx + 1, 20 left font 'Sans,12'
set label 29 'Q, K, V, dO (fp16); LSE, D_i (fp32, from preprocess_kernel)' at bx + 3, 16.5 left
set label 30 'dQ_acc (fp32): atomics (sm_90: TMA); then dq_convert_kernel -> dQ' at bx + 3, 12.5 left tc rgb RED
set label 31 'dK_j, dV_j (fp16): written once, after the loop' at bx + 3, 8.5 left
set label 32 'deterministic variant: no dQ_acc; dq_kernel walks a row instead' at bx + 3, 4.5 left font 'Sans,10'
# the flows between levels
set arrow 3 from bx - 3, 16.5 to bx - 3, 32 as 1
set label 33 'cp.async' at bx - 3.5, 24 right font 'Sans,10'
set arrow 4 from bx - 6, 36 to bx - 6, 52 as 1
set label 34 'ldmatrix' at bx - 6.5, 45 right font 'Sans,10'
set arrow 5 from bx + bw + 1.5, 51 to bx + bw + 1.5, 30 as 2
set label 35 'P, dS' at bx + bw + 2.5, 40 left tc rgb RED
set arrow 6 from bx + bw + 1.5, 29 to bx + bw + 1.5, 13 as 2
set label 36 'dQ +=' at bx + bw + 2.5, 21 left tc rgb RED

plot NaN notitle
