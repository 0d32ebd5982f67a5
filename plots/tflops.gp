# tflops.gp: throughput against sequence length, fa2 sweep (FlashAttention-2's benchmark shapes:
# B x N = 16,384 tokens and H x D = 2048, i.e. 32 heads at D = 64, 16 at D = 128), one panel
# per (D, causal) and one legend for all four, with the device's dense fp16 tensor-core peak as
# a dashed line and PyTorch's FlashAttention-2 backend (sdpa_flash) drawn as the FA2 line to reach.
#
#   gnuplot -e "csv='plots/h100-80gb-hbm3/results.csv'; outdir='plots/h100-80gb-hbm3'; PEAK=989" \
#           plots/tflops.gp
#   optional: gpu='...' (default: the CSV's gpu column); PEAK=0: no peak line;
#   PASS='bwd': the rows of the backward pass instead (tflops_bwd.gp sets it)
#
# Writes outdir/tflops.png. FLOPs = 4 B H N^2 D, halved for causal. Points a stage could not
# measure are drawn in the shaded "not measured" row under the data of their panel, in the
# stage's colour with their own symbol. Style (colours, dashes, points): plots/style.gpi.

if (!exists("csv")) csv = 'results.csv'
if (!exists("outdir")) outdir = '.'
# series.awk and style.gpi sit beside this script
if (!exists("plotsdir")) plotsdir = exists("ARG0") && strlen(ARG0) > 0 ? \
                                    system(sprintf("dirname '%s'", ARG0)) : 'plots'
if (!exists("PEAK")) PEAK = 0
W = 1600; HT = 1100
load plotsdir . '/style.gpi'
if (!exists("PASS")) PASS = 'fwd'
S0 = STYLE_S . " -v sweep=fa2 -v PASS=" . PASS
Q = STYLE_Q
if (!exists("gpu")) gpu = system(S0 . " -v mode=gpu" . Q)
set output outdir . (PASS eq 'bwd' ? '/tflops_bwd.png' : '/tflops.png')
PASS_WORDS = PASS eq 'bwd' ? 'backward' : 'forward'
PASS_FLOPS = PASS eq 'bwd' ? '2.5 x 4 B H N^2 D per pass' : '4 B H N^2 D per pass'

max(a, b) = a > b ? a : b

keys = system(S0 . " -v mode=keys" . Q)
nk = words(keys)
dmax = real(system(S0 . " -v y=tflops -v mode=max" . Q))
dmin = real(system(S0 . " -v y=tflops -v mode=min" . Q))
# The keys with a point not measured in any panel: each its own line of every panel's band.
markkeys = ''
do for [i = 1:nk] {
    k = word(keys, i)
    if (int(system(sprintf("%s -v key=%s -v mode=count -v status=notok%s", S0, k, Q))) > 0) {
        markkeys = markkeys . ' ' . k
    }
}
nm = words(markkeys)

set multiplot layout 2, 2 margins 0.06, 0.79, 0.07, 0.90 spacing 0.07, 0.09 \
    title sprintf("Attention %s throughput at the fa2 shapes - %s\n%s", PASS_WORDS, gpu, FA2_WORDS)
set xlabel 'sequence length N (tokens)'
set ylabel sprintf('TFLOP/s (%s, halved when causal)', PASS_FLOPS)
set logscale x 2
# log y: the first stages run at a few TFLOP/s, the last ones near FA2's hundreds
set logscale y
set format y '%.10g'
set xrange [400:20000]
set xtics ('512' 512, '1k' 1024, '2k' 2048, '4k' 4096, '8k' 8192, '16k' 16384)

top = max(PEAK, dmax)
if (top <= 0) top = 1.0
if (dmin <= 0) dmin = top / 1000.0
lo10 = 10 ** floor(log10(dmin) - 0.0001)
step = 2.2
band_top = lo10 / 1.6
yband(i) = band_top / step ** i
bottom = nm > 0 ? band_top / step ** (nm + 1) : lo10
set yrange [bottom : top * 2.5]
# y tics only where the data are, never in the band
set ytics lo10, 10, top * 2.5
if (PEAK > 0) {
    set arrow 1 from graph 0, first PEAK to graph 1, first PEAK nohead dt 2 lw 1.5 lc rgb '#444444'
    set label 1 sprintf('dense fp16 peak %g TFLOP/s', PEAK) at graph 0.02, first PEAK * 1.4 left tc rgb '#444444'
}
if (nm > 0) {
    set object 1 rect from graph 0, first bottom to graph 1, first band_top behind fc rgb BAND_FILL fs solid 1.0 noborder
    set label 2 'not measured (symbols: see the key)' at graph 0.5, first band_top / 1.3 center tc rgb BAND_TEXT font ',9'
    do for [j = 1:nm] {
        k = word(markkeys, j)
        set label (10 + j) k at graph 0.01, first yband(j) left tc rgb colour(k) font ',9'
    }
}

legend = ''
do for [panel = 1:4] {
    d = (panel % 2 == 1) ? 128 : 64
    c = (panel > 2) ? 1 : 0
    S = sprintf("%s -v D=%d -v causal=%d -v y=tflops", S0, d, c)
    set title sprintf('D = %d, %s, H = %d heads', d, c ? 'causal' : 'non-causal', 2048 / d)
    unset key
    cmd = ''
    do for [i = 1:nk] {
        k = word(keys, i)
        xy = sprintf("%s -v key=%s -v mode=xy%s", S, k, Q)
        if (strlen(system(xy)) > 0) {
            cmd = cmd . sprintf('"< %s" using 1:2 with linespoints %s notitle, ', xy, linestyle(k))
            if (strstrt(legend . ' ', ' ' . k . ' ') == 0) { legend = legend . ' ' . k }
        }
    }
    do for [j = 1:nm] {
        k = word(markkeys, j)
        mk = sprintf("%s -v key=%s -v mode=marks%s", S, k, Q)
        if (strlen(system(mk)) > 0) {
            cmd = cmd . sprintf('"< %s" using 1:(%g):2 with points pt variable ps 1.6 lw 2 lc rgb "%s" notitle, ', \
                                mk, yband(j), colour(k))
        }
    }
    unset label 3
    if (strlen(cmd) == 0) {
        set label 3 'no results for this shape' at graph 0.5, graph 0.5 center
        cmd = 'NaN notitle, '
    }
    # the one legend, right of the panels, drawn with the last one: every key of any panel
    if (panel == 4) {
        set key at screen 0.805, screen 0.90 left top Left reverse box spacing 1.2 width 1 font ',10'
        do for [i = 1:nk] {
            k = word(keys, i)
            if (strstrt(legend . ' ', ' ' . k . ' ') > 0) {
                cmd = cmd . sprintf('NaN with linespoints %s title "%s", ', linestyle(k), name(k))
            }
        }
        if (PEAK > 0) {
            cmd = cmd . 'NaN with lines dt 2 lw 1.5 lc rgb "#444444" title "dense fp16 peak", '
        }
        statuses = system(S0 . " -v mode=statuses" . Q)
        do for [j = 1:words(statuses)] {
            s = word(statuses, j)
            cmd = cmd . sprintf('NaN with points pt %d ps 1.6 lw 2 lc rgb "%s" title "not measured: %s", ', \
                                marker(s), BAND_TEXT, label(s))
        }
    }
    eval('plot ' . cmd[1:strlen(cmd) - 2])
}
unset multiplot
set output
