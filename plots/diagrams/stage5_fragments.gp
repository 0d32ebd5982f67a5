# stage5_fragments.gp: which lane holds which element of the mma.sync.m16n8k16 operands (PTX ISA,
# "Matrix Fragments for mma.m16n8k16", fp16 A and B, fp32 C/D). Lane l, g = l / 4, t = l % 4.
# The number in a cell is the lane holding that element; the colour is the register (A: 4
# registers of 2 halves, B: 2 of 2 halves, C: 4 floats). Lane 5's elements are outlined.
#   gnuplot plots/diagrams/stage5_fragments.gp   -> plots/diagrams/stage5_fragments.png
if (!exists("outdir")) outdir = system("dirname '" . ARG0 . "'")
set terminal pngcairo size 1400, 680 noenhanced font 'Sans,10'
set output outdir . '/stage5_fragments.png'
unset border; unset tics; unset key
set size ratio -1
set xrange [-1.5 : 46]
set yrange [-5.2 : 19.2]
set style fill solid 1.0 border lc rgb 'white'
reg_colour(r) = r == 0 ? 0x9ecae1 : r == 1 ? 0xfdae6b : r == 2 ? 0xa1d99b : 0xcbc9e2
LANE = 5
# element i of a panel of C columns: row i / C, column i % C; cell centre at (x0 + col, 15 - row)
row(i, C) = int(i) / C
col(i, C) = int(i) % C
# A, 16 x 16 (rows = query rows, columns = k): reg (r >= 8) + 2 (c >= 8), lane 4 (r % 8) + (c % 8) / 2
laneA(i) = 4 * (row(i, 16) % 8) + (col(i, 16) % 8) / 2
regA(i) = (row(i, 16) >= 8) + 2 * (col(i, 16) >= 8)
# B, 16 x 8 (rows = k, columns = n): reg (k >= 8), lane 4 n + (k % 8) / 2
laneB(i) = 4 * col(i, 8) + (row(i, 8) % 8) / 2
regB(i) = row(i, 8) >= 8
# C, 16 x 8 (rows = query rows, columns = n): reg 2 (r >= 8) + c % 2, lane 4 (r % 8) + c / 2
laneC(i) = 4 * (row(i, 8) % 8) + col(i, 8) / 2
regC(i) = 2 * (row(i, 8) >= 8) + col(i, 8) % 2
XA = 0; XB = 19; XC = 30
set label 1 "A: 16 x 16 halves (Q_i, or P as it leaves the softmax)" at XA, 17.6 left font 'Sans,12'
set label 2 "B: 16 x 8 (K_j^T, or V_j)" at XB, 17.6 left font 'Sans,12'
set label 3 "C, D: 16 x 8 floats (S, or O_acc)" at XC, 17.6 left font 'Sans,12'
set label 4 "rows" at XA - 1.2, 8 center rotate by 90
set label 5 "k (the summed index)" at XA + 8, -0.9 center
set label 6 "n (keys of S; head-dim columns of O)" at XB + 4, -0.9 center
set label 7 "k" at XB - 0.8, 8 center rotate by 90
set label 8 "n" at XC + 4, -0.9 center
set label 9 "number in a cell: the lane that holds it (g = lane / 4 picks the rows, t = lane % 4 the column pair); colour: the register. Lane 5 (g = 1, t = 1) is outlined." at XA, -2.4 left
set label 10 "A: a0 = (row g; cols 2t, 2t+1), a1 = (row g+8; same), a2 = (row g; cols 2t+8, 2t+9), a3 = (row g+8; same)." at XA, -3.4 left
set label 11 "B: b0 = (k 2t, 2t+1; column g), b1 = (k 2t+8, 2t+9; column g).   C: c0, c1 = (row g; columns 2t, 2t+1), c2, c3 = (row g+8; same)." at XA, -4.4 left
# register keys
do for [r = 0:3] {
    set object 20 + r rect from XC + 9.2, 15 - 2 * r - 0.4 to XC + 10.2, 15 - 2 * r + 0.6 fc rgb reg_colour(r) fs solid 1.0 noborder
    set label 20 + r sprintf("register %d", r) at XC + 10.5, 15 - 2 * r + 0.1 left
}
plot sample \
  [i = 0 : 255 : 1] '+' using (XA + col($1, 16) + 0.5) : (15 - row($1, 16) + 0.5) : (0.5) : (0.5) : (reg_colour(regA($1))) with boxxyerror fc rgb variable, \
  [i = 0 : 255 : 1] '+' using (XA + col($1, 16) + 0.5) : (15 - row($1, 16) + 0.5) : (sprintf("%d", laneA($1))) with labels font 'Sans,8', \
  [i = 0 : 127 : 1] '+' using (XB + col($1, 8) + 0.5) : (15 - row($1, 8) + 0.5) : (0.5) : (0.5) : (reg_colour(regB($1))) with boxxyerror fc rgb variable, \
  [i = 0 : 127 : 1] '+' using (XB + col($1, 8) + 0.5) : (15 - row($1, 8) + 0.5) : (sprintf("%d", laneB($1))) with labels font 'Sans,8', \
  [i = 0 : 127 : 1] '+' using (XC + col($1, 8) + 0.5) : (15 - row($1, 8) + 0.5) : (0.5) : (0.5) : (reg_colour(regC($1))) with boxxyerror fc rgb variable, \
  [i = 0 : 127 : 1] '+' using (XC + col($1, 8) + 0.5) : (15 - row($1, 8) + 0.5) : (sprintf("%d", laneC($1))) with labels font 'Sans,8', \
  [i = 0 : 255 : 1] '+' using (laneA($1) == LANE ? XA + col($1, 16) + 0.5 : NaN) : (15 - row($1, 16) + 0.5) : (0.45) : (0.45) with boxxyerror fs empty border lw 2.5 lc rgb 'black', \
  [i = 0 : 127 : 1] '+' using (laneB($1) == LANE ? XB + col($1, 8) + 0.5 : NaN) : (15 - row($1, 8) + 0.5) : (0.45) : (0.45) with boxxyerror fs empty border lw 2.5 lc rgb 'black', \
  [i = 0 : 127 : 1] '+' using (laneC($1) == LANE ? XC + col($1, 8) + 0.5 : NaN) : (15 - row($1, 8) + 0.5) : (0.45) : (0.45) with boxxyerror fs empty border lw 2.5 lc rgb 'black'
