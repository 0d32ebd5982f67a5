# stage3_timeline.gp: one block's time line over four K/V tiles (stage3_cp_async/README.md, "The
# idea"). Top: the variant sync (stage 2's loop): load a tile, wait at a barrier, compute, wait
# again; nothing overlaps. Bottom: the default: two buffers; while the block computes on tile j in
# one, the copies of tile j + 1 fly into the other (cp.async on sm_80+, registers on sm_75), and one
# barrier per tile says both "tile j has landed" and "everybody is done with tile j - 1".
# Durations are illustrative (a load 3 units, a tile's math 5), not measured.
#   gnuplot plots/diagrams/stage3_timeline.gp      (writes stage3_timeline.png beside this script)

dir = system(sprintf("dirname '%s'", ARG0))
if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
    set terminal pngcairo size 1320, 560 noenhanced font 'Sans,11'
} else {
    set terminal png size 1320, 560 noenhanced
}
set output dir . '/stage3_timeline.png'
unset border; unset tics; unset key
set margins 0, 0, 0, 0
set xrange [0:132]; set yrange [0:56]

LOADC = '#6baed6'; MATHC = '#f4a261'; BARC = '#555555'
L = 3.0; C = 5.0; B = 0.5   # load, compute, barrier (time units)
U = 2.6; X0 = 26            # x per time unit, where time 0 is
tx(t) = X0 + U * t
o = 1; lb = 100

# ---- top: variant sync ----
yS = 42
set label 1 'variant sync (stage 2)' at 2, yS + 7 left font 'Sans,12'
set label 2 'block' at X0 - 2, yS right
t = 0
do for [j = 0:3] {
    set object o rect from tx(t), yS - 2 to tx(t + L), yS + 2 fc rgb LOADC fs solid 1.0 border lc rgb '#333333'; o = o + 1
    set label lb sprintf('load %d', j) at tx(t + L / 2), yS center font 'Sans,9'; lb = lb + 1
    t = t + L
    set object o rect from tx(t), yS - 2 to tx(t + B), yS + 2 fc rgb BARC fs solid 1.0 noborder; o = o + 1
    t = t + B
    set object o rect from tx(t), yS - 2 to tx(t + C), yS + 2 fc rgb MATHC fs solid 1.0 border lc rgb '#333333'; o = o + 1
    set label lb sprintf('compute %d', j) at tx(t + C / 2), yS center font 'Sans,9'; lb = lb + 1
    t = t + C
    set object o rect from tx(t), yS - 2 to tx(t + B), yS + 2 fc rgb BARC fs solid 1.0 noborder; o = o + 1
    t = t + B
}
set label 3 sprintf('4 tiles: %g units', t) at tx(t) + 1, yS left font 'Sans,10'

# ---- bottom: default, two buffers ----
yC = 22; yL = 14
set label 4 'default: two buffers, the next tile in flight' at 2, yC + 8 left font 'Sans,12'
set label 5 'block computes' at X0 - 2, yC right
set label 6 'copies in flight' at X0 - 2, yL right
t = 0
set object o rect from tx(t), yL - 2 to tx(t + L), yL + 2 fc rgb LOADC fs solid 1.0 border lc rgb '#333333'; o = o + 1
set label lb 'tile 0 -> buf 0' at tx(t + L / 2), yL center font 'Sans,8'; lb = lb + 1
t = t + L
do for [j = 0:3] {
    # wait_group + barrier: tile j has landed, tile j - 1 is done with
    set object o rect from tx(t), yC - 2 to tx(t + B), yC + 2 fc rgb BARC fs solid 1.0 noborder; o = o + 1
    t = t + B
    if (j < 3) {
        set object o rect from tx(t), yL - 2 to tx(t + L), yL + 2 fc rgb LOADC fs solid 1.0 border lc rgb '#333333'; o = o + 1
        set label lb sprintf('tile %d -> buf %d', j + 1, (j + 1) % 2) at tx(t + L / 2), yL center font 'Sans,8'; lb = lb + 1
    }
    set object o rect from tx(t), yC - 2 to tx(t + C), yC + 2 fc rgb MATHC fs solid 1.0 border lc rgb '#333333'; o = o + 1
    set label lb sprintf('compute %d (buf %d)', j, j % 2) at tx(t + C / 2), yC center font 'Sans,9'; lb = lb + 1
    t = t + C
}
set label 7 sprintf('4 tiles: %g units', t) at tx(t) + 1, yC left font 'Sans,10'

# legend and notes
set object o rect from 4, 3 to 7, 5 fc rgb LOADC fs solid 1.0 border lc rgb '#333333'; o = o + 1
set label 8 'global -> shared copy (its latency)' at 8, 4 left font 'Sans,10'
set object o rect from 44, 3 to 47, 5 fc rgb MATHC fs solid 1.0 border lc rgb '#333333'; o = o + 1
set label 9 'the tile''s math (S, softmax, P V)' at 48, 4 left font 'Sans,10'
set object o rect from 82, 3 to 83, 5 fc rgb BARC fs solid 1.0 noborder; o = o + 1
set label 10 '__syncthreads() (and cp.async.wait_group 0)' at 84, 4 left font 'Sans,10'
set label 11 'one barrier per tile instead of two; with two blocks per SM the other block also fills the gaps of the top line' at 4, 8.5 left font 'Sans,10'

plot NaN notitle
