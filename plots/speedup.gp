# speedup.gp: speedup of every stage (and of PyTorch SDPA) over stage 0 and over stage 1,
# long sweep (B = H = 1, D = 128, non-causal), two panels side by side, one legend.
#
#   gnuplot -e "csv='plots/h100-80gb-hbm3/results.csv'; outdir='plots/h100-80gb-hbm3'" \
#           plots/speedup.gp
#   optional: gpu='...' (default: the CSV's gpu column)
#
# Writes outdir/speedup.png. Speedup at N = time of the base stage / time of the stage, both
# measured; stage 0 runs out of memory at large N, so the right panel (over stage 1, the first
# fused kernel) carries the comparison to the end of the sweep. Style: plots/style.gpi.

if (!exists("csv")) csv = 'results.csv'
if (!exists("outdir")) outdir = '.'
# series.awk and style.gpi sit beside this script
if (!exists("plotsdir")) plotsdir = exists("ARG0") && strlen(ARG0) > 0 ? \
                                    system(sprintf("dirname '%s'", ARG0)) : 'plots'
W = 1600; HT = 700
load plotsdir . '/style.gpi'
S = STYLE_S . " -v sweep=long"
Q = STYLE_Q
if (!exists("gpu")) gpu = system(S . " -v mode=gpu" . Q)
set output outdir . '/speedup.png'

keys = system(S . " -v mode=keys" . Q)
nk = words(keys)

set multiplot layout 1, 2 margins 0.05, 0.78, 0.11, 0.87 spacing 0.07, 0 \
    title sprintf("Speedup over the first stages (B = H = 1, D = 128, non-causal) - %s", gpu)
set xlabel 'sequence length N (tokens)'
set ylabel 'speedup (time of base stage / time of stage, x)'
set logscale xy
set xrange [800:340000]
eval('set xtics ' . LONG_XTICS)
set format y '%gx'
set grid xtics ytics mytics lc rgb '#dddddd'

# One legend for both panels, right of them: every key that has a ratio in either panel.
legend = ''
do for [p = 0:1] {
    base = system(sprintf("%s -v mode=stagekey -v base=stage%d%s", S, p, Q))
    unset label
    unset key
    cmd = ''
    if (strlen(base) > 0) {
        set title sprintf('over %s', base)
        do for [i = 1:nk] {
            k = word(keys, i)
            if (!(k eq base)) {
                r = sprintf("%s -v key=%s -v base=%s -v mode=ratio%s", S, k, base, Q)
                if (strlen(system(r)) > 0) {
                    cmd = cmd . sprintf('"< %s" using 1:2 with linespoints %s notitle, ', r, linestyle(k))
                    if (strstrt(legend . ' ', ' ' . k . ' ') == 0) { legend = legend . ' ' . k }
                }
            }
        }
    } else {
        set title sprintf('over stage %d', p)
    }
    if (strlen(cmd) == 0) {
        set label sprintf('no stage %d times to compare with', p) at graph 0.5, graph 0.5 center
        set yrange [0.5:2]
        cmd = 'NaN notitle, '
    } else {
        set yrange [*:*]
    }
    if (p == 1) {
        set key at screen 0.80, screen 0.87 left top Left reverse box spacing 1.2 width 1 font ',10'
        do for [i = 1:nk] {
            k = word(keys, i)
            if (strstrt(legend . ' ', ' ' . k . ' ') > 0) {
                cmd = cmd . sprintf('NaN with linespoints %s title "%s", ', linestyle(k), name(k))
            }
        }
    }
    # the base stage itself: speedup 1
    eval('plot ' . cmd . '1 with lines dt 3 lc rgb "#999999" notitle')
}
unset multiplot
set output
