# stage10_zigzag.gp: who computes what of a causal attention over two GPUs
# (stage10_context_parallel/README.md, "The idea"). The N x N matrix of (query, key) pairs, queries
# down, keys across, cut into 2P = 4 chunks of tokens; only the pairs on or below the diagonal are
# computed (the causal mask). Left: the contiguous split (GPU 0 holds tokens of chunks 0-1, GPU 1
# of chunks 2-3): GPU 1's queries meet three times the pairs GPU 0's do. Right: the zigzag split
# (GPU 0 holds chunks 0 and 3, GPU 1 chunks 1 and 2): each GPU's rows hold the same number of pairs.
# Each GPU computes the rows of its own queries; the labels give the ring step at which a block
# is computed (step 0: its own keys, step 1: the other GPU's, arrived around the ring).
#   gnuplot plots/diagrams/stage10_zigzag.gp      (writes stage10_zigzag.png beside this script)

dir = system(sprintf("dirname '%s'", ARG0))
if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
    set terminal pngcairo size 1200, 600 noenhanced font 'Sans,11'
} else {
    set terminal png size 1200, 600 noenhanced
}
set output dir . '/stage10_zigzag.png'
unset border; unset tics; unset key
set margins 0, 0, 0, 0
set xrange [0:120]; set yrange [0:60]

G0 = '#6baed6'; G1 = '#f4a261'
S = 10.0                 # a chunk's side
# owner of chunk c: contiguous (c < 2: GPU 0), zigzag (chunks 0 and 3: GPU 0)
own_c(c) = c < 2 ? 0 : 1
own_z(c) = (c == 0 || c == 3) ? 0 : 1
o = 1; lb = 100

# draw one panel at x0 (top-left corner of the matrix at x0, 52); owner() by split
do for [panel = 0:1] {
    x0 = 10 + panel * 60; y0 = 52
    title = panel == 0 ? 'contiguous: GPU 0 chunks 0-1, GPU 1 chunks 2-3' : 'zigzag: GPU 0 chunks 0 and 3, GPU 1 chunks 1 and 2'
    set label lb title at x0 + 20, y0 + 5 center font 'Sans,11'; lb = lb + 1
    do for [qc = 0:3] {
        oq = panel == 0 ? own_c(qc) : own_z(qc)
        set label lb sprintf('q %d', qc) at x0 - 1, y0 - S * qc - S / 2 right font 'Sans,9'; lb = lb + 1
        do for [kc = 0:qc] {
            ok = panel == 0 ? own_c(kc) : own_z(kc)
            col = oq == 0 ? G0 : G1
            xl = x0 + S * kc; yt = y0 - S * qc
            if (kc < qc) {   # a whole block below the diagonal
                set object o rect from xl, yt - S to xl + S, yt fc rgb col fs solid 1.0 border lc rgb '#333333'; o = o + 1
            } else {         # the diagonal block: its lower triangle
                set object o polygon from xl, yt to xl, yt - S to xl + S, yt - S to xl, yt fc rgb col fs solid 1.0 border lc rgb '#333333'; o = o + 1
            }
            set label lb sprintf('step %d', oq == ok ? 0 : 1) at xl + (kc < qc ? S / 2 : S / 3), yt - (kc < qc ? S / 2 : 2 * S / 3) center font 'Sans,8'; lb = lb + 1
        }
    }
    do for [kc = 0:3] {
        set label lb sprintf('k %d', kc) at x0 + S * kc + S / 2, y0 + 1.5 center font 'Sans,9'; lb = lb + 1
    }
    work = panel == 0 ? 'GPU 0: 2 blocks of work, GPU 1: 6' : 'GPU 0: 4 blocks of work, GPU 1: 4'
    set label lb work at x0 + 20, y0 - 4 * S - 4 center font 'Sans,10'; lb = lb + 1
}
set object o rect from 45, 3 to 48, 6 fc rgb G0 fs solid 1.0; o = o + 1
set label lb 'GPU 0 computes' at 49, 4.5 left; lb = lb + 1
set object o rect from 70, 3 to 73, 6 fc rgb G1 fs solid 1.0; o = o + 1
set label lb 'GPU 1 computes' at 74, 4.5 left; lb = lb + 1
plot NaN
