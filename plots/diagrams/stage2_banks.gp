# stage2_banks.gp: why stage 2 pads the rows of Q_smem (stage2_smem_tiling/README.md, "The idea").
# Shared memory is drawn 128 bytes per line: 32 banks of 4 bytes, i.e. 8 slots of 16 bytes, each
# slot 4 banks. Q_smem holds one fp16 row of D = 128 halves (256 bytes, 16 slots) per thread. The 8
# threads of a quarter-warp each read the 16-byte chunk at the same column of their own row
# (coloured, labelled with the thread). Left: rows 256 bytes apart (variant nopad): every chunk
# falls in banks 0-3, 8 wavefronts. Right: rows padded by Q_PAD = 8 halves (16 bytes, grey), 272
# bytes apart: the 8 chunks fall in 8 different slots, 1 wavefront.
#   gnuplot plots/diagrams/stage2_banks.gp      (writes stage2_banks.png beside this script)

dir = system(sprintf("dirname '%s'", ARG0))
if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
    set terminal pngcairo size 1320, 760 noenhanced font 'Sans,11'
} else {
    set terminal png size 1320, 760 noenhanced
}
set output dir . '/stage2_banks.png'
unset border; unset tics; unset key
set margins 0, 0, 0, 0
set xrange [0:132]; set yrange [0:78]

ROWA = '#e3ecf8'; ROWB = '#e5f3e0'; PADC = '#bdbdbd'
thread_colour(t) = t == 0 ? 0xe41a1c : t == 1 ? 0x377eb8 : t == 2 ? 0x4daf4a : t == 3 ? 0x984ea3 : \
                   t == 4 ? 0xff7f00 : t == 5 ? 0xa65628 : t == 6 ? 0xf781bf : 0x666666
W = 6.0; H = 3.4   # one 16-byte slot
TOP = 66           # y of the top of line 0
LINES = 16
o = 1; lb = 100

# draw one panel: rows of STRIDE slots (16 data slots + STRIDE - 16 padding slots), x0 its left edge
do for [panel = 0:1] {
    x0 = panel == 0 ? 6 : 72
    stride = panel == 0 ? 16 : 17
    do for [slot = 0 : LINES * 8 - 1] {
        line = slot / 8; col = slot % 8
        row = slot / stride; k = slot % stride
        if (row < 8) {
            colour = k >= 16 ? PADC : (row % 2 == 0 ? ROWA : ROWB)
            if (k == 0) { colour = sprintf('#%06x', thread_colour(row)) }
            set object o rect from x0 + col * W, TOP - (line + 1) * H to x0 + (col + 1) * W, TOP - line * H \
                fc rgb colour fs solid 1.0 border lc rgb '#777777' lw 1
            o = o + 1
            if (k == 0) {
                set label lb sprintf('t%d', row) at x0 + (col + 0.5) * W, TOP - (line + 0.5) * H center tc rgb '#ffffff' font 'Sans,10'
                lb = lb + 1
            }
        }
    }
    # bank numbers above the slots
    do for [col = 0:7] {
        set label lb sprintf('%d-%d', 4 * col, 4 * col + 3) at x0 + (col + 0.5) * W, TOP + 1.5 center font 'Sans,9'
        lb = lb + 1
    }
}
do for [line = 0 : LINES - 1] {
    set label lb sprintf('%d', 128 * line) at 5, TOP - (line + 0.5) * H right font 'Sans,8'
    lb = lb + 1
}
set label 1 'nopad: rows D = 128 halves = 256 bytes apart' at 6, 75.5 left font 'Sans,12'
set label 2 'default: rows padded by Q_PAD = 8 halves, 272 bytes apart' at 72, 75.5 left font 'Sans,12'
set label 3 'banks' at 6 + 4 * W, TOP + 4 center font 'Sans,9'
set label 4 'banks' at 72 + 4 * W, TOP + 4 center font 'Sans,9'
set label 5 'byte' at 5, TOP + 1.5 right font 'Sans,8'
set label 6 'threads t0..t7 all read banks 0-3: 8 wavefronts (an 8-way conflict)' at 6, 2.5 left tc rgb '#b03030'
set label 7 'threads t0..t7 read 8 different groups of banks: 1 wavefront' at 72, 2.5 left tc rgb '#2b7a2b'
set label 8 'each cell: 16 bytes = 8 halves = 4 banks; a line: 128 bytes = all 32 banks; grey: padding' at 66, 8 center font 'Sans,10'

plot NaN notitle
