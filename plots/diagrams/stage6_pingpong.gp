# stage6_pingpong.gp: one persistent block of stage 6 over four turns (stage6_hopper/README.md, "The
# idea"). One producer warpgroup (one thread issues the TMA copies of K and V into a ring of two
# slots) and two consumer warpgroups of 64 query rows each. A consumer's turn issues two wgmma
# groups back to back: S = Q K^T of the next key tile and O += P V of this one (issue_turn), then
# passes the turn to the other warpgroup; it waits only for S (wgmma.wait_group 1) and takes the
# row maxima of the next key tile (row_max) while its own P V runs; after the wait for P V
# (wait_group 0, retire_pv) come the exponentials, written to fp16 into P, beside O *= alpha
# (exp_pack), while the other warpgroup's GEMMs keep the tensor cores busy. Durations are
# illustrative (a turn's GEMMs 6 units, the maxima 1.5, the exponentials 3), not measured.
#   gnuplot plots/diagrams/stage6_pingpong.gp      (writes stage6_pingpong.png beside this script)

dir = system(sprintf("dirname '%s'", ARG0))
if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
    set terminal pngcairo size 1320, 620 noenhanced font 'Sans,11'
} else {
    set terminal png size 1320, 620 noenhanced
}
set output dir . '/stage6_pingpong.png'
unset border; unset tics; unset key
set margins 0, 0, 0, 0
set xrange [0:132]; set yrange [0:62]

TMAC = '#9e9e9e'
W1S = '#2171b5'; W1P = '#6baed6'; W1M = '#c6dbef'   # warpgroup 1: S, P V, softmax
W2S = '#d94801'; W2P = '#fd8d3c'; W2M = '#fdd0a2'   # warpgroup 2
RETC = '#555555'; TURNC = '#000000'
G = 3.0; RM = 1.5; SE = 3.0  # one GEMM (S or P V) of a warpgroup, the row maxima, the exponentials
U = 1.9; X0 = 32           # x per time unit, where time 0 is
tx(t) = X0 + U * t
o = 1; lb = 100

yT = 50; yC = 39; y1 = 27; y2 = 16
set label 1 'producer (1 thread, 24 regs)' at X0 - 2, yT right font 'Sans,10'
set label 2 'tensor cores (wgmma)' at X0 - 2, yC right font 'Sans,10'
set label 3 'consumer 1 (240 regs)' at X0 - 2, y1 right font 'Sans,10'
set label 4 'consumer 2 (240 regs)' at X0 - 2, y2 right font 'Sans,10'
set label 5 'ping-pong: the warpgroups take turns at issuing; each one''s softmax runs under the GEMMs' at 2, 59 left font 'Sans,12'

do for [r = 0:3] {
    do for [w = 1:2] {
        t0 = 12 * r + 6 * (w - 1)           # the tensor cores start this warpgroup's turn
        cS = (w == 1) ? W1S : W2S; cP = (w == 1) ? W1P : W2P; cM = (w == 1) ? W1M : W2M
        y = (w == 1) ? y1 : y2
        # the turn: S of key tile j+r+1, then P V of key tile j+r
        set object o rect from tx(t0), yC - 2.5 to tx(t0 + G), yC + 2.5 fc rgb cS fs solid 1.0 border lc rgb '#333333'; o = o + 1
        set label lb sprintf('S j+%d', r + 1) at tx(t0 + G / 2), yC center font 'Sans,8' tc rgb '#ffffff'; lb = lb + 1
        set object o rect from tx(t0 + G), yC - 2.5 to tx(t0 + 2 * G), yC + 2.5 fc rgb cP fs solid 1.0 border lc rgb '#333333'; o = o + 1
        pv = (r == 0) ? 'PV j' : sprintf('PV j+%d', r)
        set label lb pv at tx(t0 + 1.5 * G), yC center font 'Sans,8'; lb = lb + 1
        # the warpgroup: its issue (a thin bar) before the tensor cores get to it, the row maxima once
        # S is done, the exponentials once P V is done
        tI = t0 - 3
        if (r > 0) {
            set object o rect from tx(tI), y - 2.5 to tx(tI + 0.3), y + 2.5 fc rgb TURNC fs solid 1.0 noborder; o = o + 1
        }
        set object o rect from tx(t0 + G), y - 2.5 to tx(t0 + G + RM), y + 2.5 fc rgb cM fs solid 1.0 border lc rgb '#333333'; o = o + 1
        set label lb 'max' at tx(t0 + G + RM / 2), y center font 'Sans,8'; lb = lb + 1
        set object o rect from tx(t0 + 2 * G), y - 2.5 to tx(t0 + 2 * G + SE), y + 2.5 fc rgb cM fs solid 1.0 border lc rgb RETC lw 2; o = o + 1
        set label lb sprintf('exp S j+%d', r + 1) at tx(t0 + 2 * G + SE / 2), y center font 'Sans,8'; lb = lb + 1
    }
    # the producer: K and V of key tile j+r+2 into the ring slots the consumers released
    set object o rect from tx(12 * r + 1), yT - 2.5 to tx(12 * r + 4), yT + 2.5 fc rgb TMAC fs solid 1.0 border lc rgb '#333333'; o = o + 1
    set label lb sprintf('TMA K j+%d', r + 2) at tx(12 * r + 2.5), yT center font 'Sans,8'; lb = lb + 1
    set object o rect from tx(12 * r + 4.5), yT - 2.5 to tx(12 * r + 7.5), yT + 2.5 fc rgb TMAC fs solid 1.0 border lc rgb '#333333'; o = o + 1
    set label lb sprintf('TMA V j+%d', r + 2) at tx(12 * r + 6), yT center font 'Sans,8'; lb = lb + 1
}

# legend
set object o rect from 4, 7 to 7, 9 fc rgb W1S fs solid 1.0 border lc rgb '#333333'; o = o + 1
set object o rect from 7, 7 to 10, 9 fc rgb W2S fs solid 1.0 border lc rgb '#333333'; o = o + 1
set label 10 'S = Q K^T (issue_scores)' at 11, 8 left font 'Sans,10'
set object o rect from 36, 7 to 39, 9 fc rgb W1P fs solid 1.0 border lc rgb '#333333'; o = o + 1
set object o rect from 39, 7 to 42, 9 fc rgb W2P fs solid 1.0 border lc rgb '#333333'; o = o + 1
set label 11 'O += P V (issue_pv)' at 43, 8 left font 'Sans,10'
set object o rect from 64, 7 to 67, 9 fc rgb W1M fs solid 1.0 border lc rgb '#333333'; o = o + 1
set object o rect from 67, 7 to 70, 9 fc rgb W2M fs solid 1.0 border lc rgb '#333333'; o = o + 1
set label 12 'row_max (reads S only)' at 71, 8 left font 'Sans,10'
set object o rect from 95, 7 to 98, 9 fc rgb W1M fs solid 1.0 border lc rgb RETC lw 2; o = o + 1
set label 13 'retire_pv: exp_pack to P, O *= alpha' at 99, 8 left font 'Sans,10'
set object o rect from 4, 2 to 4.4, 4 fc rgb TURNC fs solid 1.0 noborder; o = o + 1
set label 14 'issue_turn: wait for my turn, issue S and P V, pass the turn (the GEMMs queue behind the other warpgroup''s)' at 6, 3 left font 'Sans,10'

plot NaN notitle
