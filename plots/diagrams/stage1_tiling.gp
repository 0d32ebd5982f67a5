# stage1_tiling.gp: stage 1's loop order (stage1_scalar_flash/README.md, "The idea").
# Left: the N x N scores of one (batch, head), cut into query tiles (rows, BR = 64) and key/value
# tiles (columns, BC); the scores are never stored: one block owns a row of tiles and walks along
# it. Right: where each operand lives while it does.
#   gnuplot plots/diagrams/stage1_tiling.gp      (writes stage1_tiling.png beside this script)

dir = system(sprintf("dirname '%s'", ARG0))
if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
    set terminal pngcairo size 1420, 640 noenhanced font 'Sans,11'
} else {
    set terminal png size 1420, 640 noenhanced
}
set output dir . '/stage1_tiling.png'
unset border; unset tics; unset key
set margins 0, 0, 0, 0
set xrange [0:142]; set yrange [0:64]

DONE = '#f9d5b0'; NOW = '#e07b39'; TODO = '#ffffff'; SKIP = '#d9d9d9'; OTHER = '#eef2f7'
REG = '#fff3d6'; SMEM = '#e5f3e0'; GMEM = '#e3ecf8'
set style arrow 1 head filled size 1.2, 20 lw 2 lc rgb '#333333'
set style arrow 2 head filled size 1.2, 20 lw 2 lc rgb NOW

# ---- left: the tile grid (6 query tiles x 6 key/value tiles) ----
x0 = 14; y0 = 52; c = 6  # top-left corner, tile size
I = 3                    # the block's query tile
J = 2                    # the key/value tile it is on now
o = 1
do for [i = 0:5] {
    do for [j = 0:5] {
        colour = j > i ? SKIP : (i != I ? OTHER : (j < J ? DONE : (j == J ? NOW : TODO)))
        set object o rect from x0 + j * c, y0 - (i + 1) * c to x0 + (j + 1) * c, y0 - i * c \
            fc rgb colour fs solid 1.0 border lc rgb '#555555' lw 1
        o = o + 1
    }
}
set label 1 'one (batch, head): S = scale Q K^T, N x N, never stored' at 2, 61 left font 'Sans,12'
set label 2 'K_j, V_j tiles (BC keys each)' at x0 + 3 * c, y0 + 2 center
set label 3 'Q tile i' at x0 - 1, y0 - (I + 0.5) * c + 0.8 right
set label 4 '(BR = 64 rows)' at x0 - 1, y0 - (I + 0.5) * c - 1.6 right font 'Sans,9'
set label 5 'outer loop: one block per Q tile, all in parallel (the grid)' at 2, y0 - 6 * c - 3 left
set label 6 'inner loop: the block walks along its row, one K/V tile at a time' at 2, y0 - 6 * c - 5.5 left tc rgb NOW
set label 7 'grey: causal, never loaded' at x0 + 6 * c + 1, y0 - 0.5 * c left font 'Sans,10'
set label 8 'done' at x0 + 0.5 * c, y0 - (I + 0.5) * c + 1.3 center font 'Sans,9'
set label 9 'now' at x0 + J * c + c / 2., y0 - (I + 0.5) * c + 1.3 center font 'Sans,9' tc rgb '#ffffff'
set arrow 1 from x0 + 0.2 * c, y0 - (I + 0.5) * c - 1.5 to x0 + 3.9 * c, y0 - (I + 0.5) * c - 1.5 as 1
# what the block keeps between steps
set arrow 2 from x0 + 6 * c + 0.5, y0 - (I + 0.5) * c to x0 + 6 * c + 5, y0 - (I + 0.5) * c as 1
set label 10 'per row: m_i, l_i, O_acc' at x0 + 6 * c + 5.5, y0 - (I + 0.5) * c + 1.2 left
set label 11 'rescaled by alpha' at x0 + 6 * c + 5.5, y0 - (I + 0.5) * c - 1.3 left
set label 12 'at each step' at x0 + 6 * c + 5.5, y0 - (I + 0.5) * c - 3.6 left

# ---- right: where the operands live ----
bx = 76; bw = 54
set object o rect from bx, 44 to bx + bw, 60 fc rgb REG fs solid 1.0 border lc rgb '#bb8833'; o = o + 1
set object o rect from bx, 24 to bx + bw, 42 fc rgb SMEM fs solid 1.0 border lc rgb '#55aa66'; o = o + 1
set object o rect from bx, 2 to bx + bw, 22 fc rgb GMEM fs solid 1.0 border lc rgb '#5577aa'; o = o + 1
set label 20 'registers (one thread = one query row i)' at bx + 1, 58 left font 'Sans,12'
set label 21 'm_i (running max), l_i (running sum): 1 float each' at bx + 3, 54.5 left
set label 22 'O_acc[D]: the running sum of p_ij v_j' at bx + 3, 51.5 left
set label 23 'S[BC]: this tile''s scores, then exp(S - m_new)' at bx + 3, 48.5 left
set label 24 'shared memory (one block)' at bx + 1, 40 left font 'Sans,12'
set label 25 'Q_smem [64][D]: loaded once, kept for the whole loop' at bx + 3, 36.5 left
set label 26 'K_smem, V_smem [BC][D]: one tile, replaced each step' at bx + 3, 33 left
set label 27 '(every thread reads the same K/V address: a broadcast)' at bx + 3, 29.5 left font 'Sans,10'
set label 28 'global memory (HBM)' at bx + 1, 20 left font 'Sans,12'
set label 29 'Q, K, V [B, H, N, D]: each K/V tile read once per Q tile' at bx + 3, 16.5 left
set label 30 'O [B, H, N, D] = O_acc / l_i: written once, at the end' at bx + 3, 12.5 left
set label 31 'LSE [B, H, N] = m_i + log(l_i)' at bx + 3, 8.5 left
set label 32 'no N x N workspace: memory grows as N, not N^2' at bx + 3, 4.5 left font 'Sans,10'
# the flows between levels
set arrow 3 from bx - 3, 16.5 to bx - 3, 32 as 1
set label 33 'load_tile' at bx - 3.5, 24 right font 'Sans,10'
set arrow 4 from bx - 3, 36 to bx - 3, 52 as 1
set label 34 '16-byte reads' at bx - 3.5, 45 right font 'Sans,10'
set arrow 5 from bx + bw + 2, 51 to bx + bw + 2, 10.5 as 1
set label 35 'O, LSE at the end' at bx + bw + 4, 31 center font 'Sans,10' rotate by 90

plot NaN notitle
