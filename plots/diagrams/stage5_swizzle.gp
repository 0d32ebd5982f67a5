# stage5_swizzle.gp: stage 5's XOR swizzle. A tile row of D = 64 halves is 128 bytes: 8 chunks
# of 16 bytes, one chunk per 4 of shared memory's 32 banks. Logical chunk c of row r is stored
# at chunk c ^ (r % 8). One 8 x 8 ldmatrix matrix is 8 rows at one logical chunk (here chunk 0,
# dark): unswizzled the 8 rows sit in the same 4 banks (an 8-way conflict), swizzled they cover
# all 32 banks once. The number in a cell is the logical chunk stored there.
#   gnuplot plots/diagrams/stage5_swizzle.gp   -> plots/diagrams/stage5_swizzle.png
if (!exists("outdir")) outdir = system("dirname '" . ARG0 . "'")
set terminal pngcairo size 1100, 620 noenhanced font 'Sans,11'
set output outdir . '/stage5_swizzle.png'
unset border; unset tics; unset key
set size ratio -1
set xrange [-2.5 : 21]
set yrange [-3.6 : 10.6]
set style fill solid 1.0 border lc rgb 'white'
# cell i: row r = i / 8 (drawn top down), stored chunk s = i % 8; logical chunk held there
r(i) = int(i) / 8
s(i) = int(i) % 8
plain(i) = s(i)
swz(i) = s(i) ^ r(i)
shade(c) = c == 0 ? 0x08519c : c == 1 ? 0x6baed6 : 0xdeebf7
ink(c) = c == 0 ? 0xffffff : 0x000000
X0 = 0; X1 = 12
set label 1 "without the swizzle: chunk c at chunk c" at X0, 10 left font 'Sans,13'
set label 2 "stage 5: chunk c of row r at chunk c ^ (r % 8)" at X1, 10 left font 'Sans,13'
do for [k = 0:7] {
    set label 10 + k sprintf("%d-%d", 4 * k, 4 * k + 3) at X0 + k + 0.5, 8.55 center font 'Sans,8'
    set label 20 + k sprintf("%d-%d", 4 * k, 4 * k + 3) at X1 + k + 0.5, 8.55 center font 'Sans,8'
    set label 30 + k sprintf("row %d", k) at X0 - 0.3, 7.5 - k right font 'Sans,9'
    set label 40 + k sprintf("row %d", k) at X1 - 0.3, 7.5 - k right font 'Sans,9'
}
set label 3 "banks" at X0 - 0.3, 8.55 right font 'Sans,8'
set label 4 "banks" at X1 - 0.3, 8.55 right font 'Sans,8'
set label 5 "one ldmatrix matrix: logical chunk 0 of rows 0-7 (dark),\nall in banks 0-3: 8 wavefronts (an 8-way conflict)" at X0, -0.6 left font 'Sans,10'
set label 6 "the same matrix: one chunk in every group\nof 4 banks, 1 wavefront" at X1, -0.6 left font 'Sans,10'
set label 7 "Number in a cell: the logical chunk (16 bytes, 8 halves of the row) stored in that place.\nRows 8-15 repeat rows 0-7; at D = 128 (16 chunks a row) the XOR changes only the low 3 bits of c." at X0 - 2.3, -2.6 left font 'Sans,10'
plot sample \
  [i = 0 : 63 : 1] '+' using (X0 + s($1) + 0.5) : (7.5 - r($1)) : (0.5) : (0.5) : (shade(plain($1))) with boxxyerror fc rgb variable, \
  [i = 0 : 63 : 1] '+' using (X0 + s($1) + 0.5) : (7.5 - r($1)) : (sprintf("%d", plain($1))) : (ink(plain($1))) with labels tc rgb variable, \
  [i = 0 : 63 : 1] '+' using (X1 + s($1) + 0.5) : (7.5 - r($1)) : (0.5) : (0.5) : (shade(swz($1))) with boxxyerror fc rgb variable, \
  [i = 0 : 63 : 1] '+' using (X1 + s($1) + 0.5) : (7.5 - r($1)) : (sprintf("%d", swz($1))) : (ink(swz($1))) with labels tc rgb variable
