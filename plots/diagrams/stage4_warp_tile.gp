# stage4_warp_tile.gp: what one warp of stage 4 does with one K/V tile. Registers and tensor cores
# on the left and right, shared memory in the middle: S goes out to shared memory as floats for the
# softmax, and P comes back from it as the A operand of P V (the round trip stage 5 removes).
#   gnuplot plots/diagrams/stage4_warp_tile.gp   -> plots/diagrams/stage4_warp_tile.png
if (!exists("outdir")) outdir = system("dirname '" . ARG0 . "'")
set terminal pngcairo size 1200, 560 noenhanced font 'Sans,11'
set output outdir . '/stage4_warp_tile.png'
unset border; unset tics; unset key
set xrange [0 : 120]
set yrange [0 : 56]
REG = '#c6dbef'; SMEM = '#fdd0a2'; TC = '#c7e9c0'
box(n, x, y, w, h, c) = sprintf("set object %d rect from %f,%f to %f,%f fc rgb '%s' fs solid 1.0 border lc rgb '#555555'", n, x, y, x + w, y + h, c)
eval box(1, 2, 38, 24, 12, REG)
set label 1 "Q_i: this warp's 16 rows\n(8 A fragments in registers\nat D = 128)" at 14, 44 center
eval box(2, 2, 20, 24, 12, SMEM)
set label 2 "K_j, V_j: BC x D halves\n(shared by the 4 warps,\ndouble-buffered)" at 14, 26 center
eval box(3, 34, 38, 22, 12, TC)
set label 3 "1. S = Q_i K_j^T\nwmma::mma_sync\n(BC / 16 accumulators)" at 45, 44 center
eval box(4, 64, 38, 24, 12, SMEM)
set label 4 "2. S_w: 16 x BC floats\nstore_matrix_sync\n(this warp's slice)" at 76, 44 center
eval box(5, 94, 38, 24, 12, REG)
set label 5 "3. online softmax\nlanes 2r, 2r+1 own row r:\nmax, sum: 1 shuffle each" at 106, 44 center
eval box(6, 94, 20, 24, 12, SMEM)
set label 6 "4. P_w: 16 x BC halves\nwritten over S_w" at 106, 26 center
eval box(7, 64, 20, 24, 12, TC)
set label 7 "5. O_acc = alpha O_acc + P V_j\n(mma_sync; P and V_j\nby load_matrix_sync)" at 76, 26 center font 'Sans,10'
eval box(8, 34, 20, 22, 12, REG)
set label 8 "O_acc: D / 16 fragments\nin registers; alpha by\nrow-number fragment" at 45, 26 center
set style arrow 1 head filled size 1.2, 20 lw 2 lc rgb '#333333'
set arrow 1 from 26, 44 to 34, 44 as 1
set arrow 2 from 26, 28 to 34, 42 as 1
set arrow 3 from 56, 44 to 64, 44 as 1
set arrow 4 from 88, 44 to 94, 44 as 1
set arrow 5 from 106, 38 to 106, 32 as 1
set arrow 6 from 94, 26 to 88, 26 as 1
set arrow 7 from 64, 26 to 56, 26 as 1
set arrow 8 from 14, 20 to 14, 16 nohead lw 2 lc rgb '#333333' dt 2
set arrow 9 from 14, 16 to 76, 16 nohead lw 2 lc rgb '#333333' dt 2
set arrow 10 from 76, 16 to 76, 20 as 1 dt 2
set label 9 "V_j" at 45, 14.5 center font 'Sans,10'
eval box(20, 2, 1, 4, 3, REG)
set label 20 "registers" at 7, 2.5 left
eval box(21, 24, 1, 4, 3, SMEM)
set label 21 "shared memory" at 29, 2.5 left
eval box(22, 50, 1, 4, 3, TC)
set label 22 "tensor cores" at 55, 2.5 left
set label 23 "Per key tile and warp: S out (16 x BC x 4 bytes) and back in, P out and back in: the round trip stage 5 removes." at 2, 9 left
set label 24 "One warp, one K/V tile of BC keys (BR = 64 query rows = 4 warps x 16)" at 60, 54 center font 'Sans,13'
plot NaN
